"""Rank 1 fails with exit status 3 at once; every other rank waits forever (no collective).

Usage: rank1_fails.py PID_DIR  (under torchrun or shoal run: reads RANK; writes PID_DIR/rank{RANK}.pid)
"""

import os
import sys
import time

rank = os.environ["RANK"]
with open(os.path.join(sys.argv[1], f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
if rank == "1":
    time.sleep(1)
    sys.exit(3)
time.sleep(3600)
