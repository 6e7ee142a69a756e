"""Report what a rank runs on: its interpreter, PATH, and which ``shoal`` it would start; imports torch.

Usage: env_report.py OUT_DIR   (writes OUT_DIR/env-rank{RANK}.json; RANK from any launcher's variables)
"""

import json
import os
import shutil
import sys

import torch  # the system's python has no torch: this line is what failed before the fix

rank = next((os.environ[n] for n in ("OMPI_COMM_WORLD_RANK", "RANK", "PMI_RANK") if n in os.environ), "0")
with open(os.path.join(sys.argv[1], f"env-rank{rank}.json"), "w") as f:
    json.dump(
        {
            "rank": int(rank),
            "executable": sys.executable,
            "path": os.environ.get("PATH", "").split(os.pathsep),
            "shoal": shutil.which("shoal"),
            "torch": torch.__version__,
        },
        f,
    )
