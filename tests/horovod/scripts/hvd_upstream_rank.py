"""One rank of Horovod's own test file under pytest: its JUnit file to OUT_DIR/rank{r}.xml.

Usage (under mpirun, started by tests/horovod/horovod_upstream.py):
    hvd_upstream_rank.py OUT_DIR TEST_FILE PER_TEST_TIMEOUT_S [SELECT]
"""

import os
import sys

import pytest

out, test_file, timeout = sys.argv[1], sys.argv[2], sys.argv[3]
select = sys.argv[4] if len(sys.argv) > 4 else ""
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
args = [
    test_file,
    "-p",
    "no:cacheprovider",
    f"--junitxml={os.path.join(out, f'rank{rank}.xml')}",
    f"--timeout={timeout}",
    "--timeout-method=signal",  # the test fails, the run goes on (thread would end the process)
    "-o",
    "junit_family=xunit1",
]
if select:
    args += ["-k", select]
with open(os.path.join(out, f"rank{rank}.log"), "w") as log:  # progress, readable while it runs
    sys.stdout = sys.stderr = log
    code = pytest.main(args + ["-v"])  # one line per test as it ends
sys.exit(code)
