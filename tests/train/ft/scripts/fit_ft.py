"""``shoal.fit(..., fault_tolerance=True, nproc=2)``: prints group 0's result as one JSON line."""

from __future__ import annotations

import json
import sys

import shoal

if __name__ == "__main__":
    result = shoal.fit("digits", fault_tolerance=True, nproc=2, epochs=1, device="cpu", out=sys.argv[1])
    print(json.dumps({"metrics": result.metrics, "model": str(result.model_path)}), flush=True)
