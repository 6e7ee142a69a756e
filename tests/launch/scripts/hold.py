"""A worker that joins the group, runs an all-reduce, says so, then waits until told to end.

Usage: hold.py DIR. Writes DIR/ready-<rank> once its collectives work, then polls for DIR/done
and leaves: the test looks at the job's sockets in between.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
(out / f"ready-{dist.get_rank()}").write_text(str(value.item()))
deadline = time.monotonic() + 300
while not (out / "done").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
