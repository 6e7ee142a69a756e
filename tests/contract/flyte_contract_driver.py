"""A Flyte task whose body runs a function on 2 workers through ``shoal.run``; each reports its view
of torchrun's variables (tests/contract/scripts/torchrun_contract.py's checks).

python flyte_contract_driver.py    prints ``torchrun-contract: {...}`` (the workflow's output)

Flyte has no path for a user's *script* through shoal: a task runs a function (``shoal.run``) or a
workload (``shoal.flyte.fit``); both start their workers with torch's elastic agent.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))

import torchrun_contract
from flytekit import task, workflow

import shoal


def rank_view() -> dict:
    return torchrun_contract.rank_view()


@task
def contract_task() -> str:
    views = shoal.run(rank_view, nproc=2, all_ranks=True, device="cpu")
    return json.dumps(torchrun_contract.report(views))


@workflow
def contract_workflow() -> str:
    return contract_task()


if __name__ == "__main__":
    print("torchrun-contract: " + contract_workflow(), flush=True)
