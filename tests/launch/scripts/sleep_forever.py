"""Write PID_DIR/rank{RANK}.pid, then sleep: a worker that only a signal ends (no torch import).

Usage: sleep_forever.py PID_DIR
"""

import os
import sys
import time

# Written aside and renamed: a pid file that exists is complete (a test may read it at once).
path = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pid")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(300)
