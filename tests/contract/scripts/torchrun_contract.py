"""An unchanged torchrun-style script: reads torchrun's variables, checks them, meets the others.

Each rank reads the variables torchrun (torch's elastic agent) gives every worker, checks them
against each other, joins the group with ``init_process_group(backend="gloo")`` (``env://``: MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE) and all-gathers every rank's view. Rank 0 then checks the views
across ranks (distinct ranks 0..N-1, one world size, one rendezvous, local ranks per node) and
writes one JSON object: to the file given as the first argument, else as one line on stdout
prefixed ``torchrun-contract:``. The object holds every rank's variables and ``problems``, the list
of broken rules (empty when the contract holds); the exit status is 1 when it is not empty.

Nothing here knows shoal: this is what a user's script written for torchrun does.
"""

import json
import os
import socket
import sys

VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "OMP_NUM_THREADS",
)
INTEGERS = tuple(name for name in VARIABLES if name not in ("MASTER_ADDR", "TORCHELASTIC_RUN_ID"))
SAME_ON_EVERY_RANK = (
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)


def own_view() -> tuple[dict, list[str]]:
    """This rank's variables (as strings, None when unset) and the rules they break on their own."""
    view = {name: os.environ.get(name) for name in VARIABLES}
    problems = [f"{name} not set" for name, value in view.items() if value is None]
    numbers = {}
    for name in INTEGERS:
        try:
            numbers[name] = int(view[name])
        except (TypeError, ValueError):
            if view[name] is not None:
                problems.append(f"{name}={view[name]!r} is not an integer")
    for low, high in (
        ("RANK", "WORLD_SIZE"),
        ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("GROUP_RANK", "GROUP_WORLD_SIZE"),
        ("ROLE_RANK", "ROLE_WORLD_SIZE"),
    ):
        if low in numbers and high in numbers and not 0 <= numbers[low] < numbers[high]:
            problems.append(f"{low}={numbers[low]} outside 0..{high}={numbers[high]}")
    if numbers.get("LOCAL_WORLD_SIZE", 0) > numbers.get("WORLD_SIZE", 1 << 30):
        problems.append("LOCAL_WORLD_SIZE > WORLD_SIZE")
    if numbers.get("OMP_NUM_THREADS", 1) < 1:
        problems.append("OMP_NUM_THREADS below 1")
    return view, problems


def across_ranks(views: list[dict]) -> list[str]:
    """The rules every rank's views break together (rank 0 checks them after the all-gather)."""
    problems = []
    world = len(views)
    ranks = sorted(int(v["RANK"]) for v in views)
    if ranks != list(range(world)):
        problems.append(f"RANK values {ranks} are not 0..{world - 1}")
    for name in SAME_ON_EVERY_RANK:
        values = sorted({str(v[name]) for v in views})
        if len(values) != 1:
            problems.append(f"{name} differs between ranks: {values}")
    if any(int(v["WORLD_SIZE"]) != world for v in views):
        problems.append(f"WORLD_SIZE is not the {world} ranks that met")
    nodes: dict[int, list[dict]] = {}
    for v in views:
        nodes.setdefault(int(v["GROUP_RANK"]), []).append(v)
    group_world = int(views[0]["GROUP_WORLD_SIZE"])
    if sorted(nodes) != list(range(group_world)):
        problems.append(f"GROUP_RANK values {sorted(nodes)} are not 0..{group_world - 1}")
    for group, members in sorted(nodes.items()):
        local = sorted(int(v["LOCAL_RANK"]) for v in members)
        if local != list(range(len(members))):
            problems.append(f"node {group}: LOCAL_RANK values {local} are not 0..{len(members) - 1}")
        if {int(v["LOCAL_WORLD_SIZE"]) for v in members} != {len(members)}:
            problems.append(f"node {group}: LOCAL_WORLD_SIZE is not its {len(members)} ranks")
        if len({v["host"] for v in members}) != 1:
            problems.append(f"node {group}: its ranks run on several hosts {sorted({v['host'] for v in members})}")
    hosts = {v["host"]: int(v["GROUP_RANK"]) for v in views}
    if len(set(hosts.values())) != len(hosts):
        problems.append(f"one GROUP_RANK spans several hosts: {hosts}")
    if any(v["ROLE_RANK"] != v["RANK"] for v in views) or any(v["ROLE_WORLD_SIZE"] != v["WORLD_SIZE"] for v in views):
        problems.append("ROLE_RANK/ROLE_WORLD_SIZE differ from RANK/WORLD_SIZE (one role)")
    return problems


def host_identity() -> str:
    """The host name and the network namespace: nodes simulated as namespaces share a host name."""
    try:
        namespace = os.readlink("/proc/self/ns/net")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()} {namespace}".strip()


def rank_view() -> dict:
    """This rank's variables, its host and the rules they break on their own."""
    view, problems = own_view()
    view["host"] = host_identity()
    view["problems"] = problems
    return view


def report(views: list[dict]) -> dict:
    """Every rank's view (by rank) and the rules broken, on a rank or across ranks."""
    problems = [f"rank {v['RANK']}: {p}" for v in views for p in v["problems"]]
    if not problems:
        problems = across_ranks(views)
    return {"ranks": sorted(views, key=lambda v: int(v["RANK"])), "problems": problems}


def main() -> int:
    view = rank_view()
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")  # env://, as a torchrun script does
    views: list = [None] * dist.get_world_size()
    dist.all_gather_object(views, view)
    status = 0
    if dist.get_rank() == 0:
        result = report(views)
        text = json.dumps(result, sort_keys=True)
        if len(sys.argv) > 1:
            with open(sys.argv[1] + ".tmp", "w") as out:
                out.write(text + "\n")
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        else:
            print(f"torchrun-contract: {text}", flush=True)
        status = 1 if result["problems"] else 0
    dist.destroy_process_group()
    import gc

    gc.collect()  # a gloo thread's last release before the interpreter exits (docs/CLIENTS.md)
    return status


if __name__ == "__main__":
    sys.exit(main())
