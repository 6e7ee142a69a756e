"""Write PID_DIR/rank{RANK}.pid, then sleep: a worker that only a signal ends (no torch import).

Usage: sleep_forever.py PID_DIR
"""

import os
import sys
import time

with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pid"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(300)
