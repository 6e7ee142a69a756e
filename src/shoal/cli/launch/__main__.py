"""``python -m shoal.cli.launch ...``: ``shoal launch`` alone (the multi-node tests start it this way)."""

from shoal.cli.launch import main

raise SystemExit(main())
