"""torchrun and the legacy torch.distributed.launch."""

from __future__ import annotations

import pytest

from shoal.env.torchrun import TorchrunEnvironment, local_rank_flag
from shoal.errors import ShoalError

# What torchrun --nnodes 2 --nproc-per-node 4 gives worker 6 (node 1, local rank 2).
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "abc",
    "RANK": "6",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "2",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "head.example",
    "MASTER_PORT": "29400",
}
NO_ARGV = ["train.py"]


def test_torchrun_worker():
    info = TorchrunEnvironment.describe(TORCHRUN, argv=NO_ARGV)
    assert (info.scheme, info.rank, info.local_rank) == ("torchrun", 6, 2)
    assert (info.world_size, info.local_world_size) == (8, 4)
    assert (info.node_rank, info.num_nodes) == (1, 2)
    assert (info.main_address, info.main_port) == ("head.example", 29400)
    assert "TORCHELASTIC_RUN_ID=abc" in info.reason and "RANK=6" in info.reason


def test_detects_without_run_id_when_the_four_variables_are_set():
    env = {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"}
    assert TorchrunEnvironment.detect(env, argv=NO_ARGV)
    del env["LOCAL_RANK"]
    assert not TorchrunEnvironment.detect(env, argv=NO_ARGV)


def test_node_count_and_rank_derived_when_group_variables_missing():
    env = {k: v for k, v in TORCHRUN.items() if not k.startswith("GROUP_")}
    info = TorchrunEnvironment.describe(env, argv=NO_ARGV)
    assert (info.node_rank, info.num_nodes) == (1, 2)  # 6 // 4, 8 // 4


def test_uneven_nodes_without_group_world_size_is_an_error():
    env = {k: v for k, v in TORCHRUN.items() if not k.startswith("GROUP_")} | {"WORLD_SIZE": "7"}
    with pytest.raises(ShoalError, match="WORLD_SIZE=7 is not a multiple of LOCAL_WORLD_SIZE=4") as err:
        TorchrunEnvironment.describe(env, argv=NO_ARGV)
    assert "GROUP_WORLD_SIZE" in err.value.hint


def test_missing_port_defaults_to_29500():
    env = {k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}
    assert TorchrunEnvironment.describe(env, argv=NO_ARGV).main_port == 29500


@pytest.mark.parametrize(
    "argv, value",
    [
        (["train.py", "--local_rank=3"], "3"),
        (["train.py", "--local-rank=3"], "3"),
        (["train.py", "--local_rank", "3", "--lr", "0.1"], "3"),
        (["train.py", "--lr", "0.1", "--local-rank", "3"], "3"),
        (["train.py", "--lr", "0.1"], None),
        (["--local_rank=9"], None),  # argv[0] is the program, never a flag
        (["train.py", "--local_rank"], None),  # flag without a value
    ],
)
def test_local_rank_flag_forms(argv, value):
    assert local_rank_flag(argv) == value


LEGACY = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"}


@pytest.mark.parametrize(
    "argv", [["t.py", "--local_rank=1"], ["t.py", "--local-rank=1"], ["t.py", "--local_rank", "1"]]
)
def test_legacy_launch_reads_local_rank_from_argv(argv):
    assert TorchrunEnvironment.detect(LEGACY, argv=argv)
    info = TorchrunEnvironment.describe(LEGACY, argv=argv)
    # single node is provable: loopback address and rank == local rank
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size, info.num_nodes) == (1, 1, 2, 2, 1)
    assert "argv --local_rank=1" in info.reason


def test_legacy_launch_not_detected_without_the_flag():
    assert not TorchrunEnvironment.detect(LEGACY, argv=["t.py", "--lr", "1"])


def test_local_rank_env_wins_over_argv():
    env = LEGACY | {"LOCAL_RANK": "0", "RANK": "0"}
    assert TorchrunEnvironment.describe(env, argv=["t.py", "--local_rank=1"]).local_rank == 0


def test_legacy_multi_node_needs_local_world_size():
    env = LEGACY | {"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1"}
    with pytest.raises(ShoalError, match="LOCAL_WORLD_SIZE not set") as err:
        TorchrunEnvironment.describe(env, argv=["t.py", "--local_rank=1"])
    assert "export LOCAL_WORLD_SIZE" in err.value.hint
    info = TorchrunEnvironment.describe(env | {"LOCAL_WORLD_SIZE": "4"}, argv=["t.py", "--local_rank=1"])
    assert (info.node_rank, info.num_nodes, info.local_world_size) == (1, 2, 4)


def test_bad_local_rank_flag():
    with pytest.raises(ShoalError, match="--local_rank='x' is not an integer"):
        TorchrunEnvironment.describe(LEGACY, argv=["t.py", "--local_rank=x"])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"RANK": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
        ({"RANK": "six"}, "RANK='six' is not an integer"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0' is below 1"),
        ({"GROUP_RANK": "2"}, "GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
        ({"RANK": "-1"}, "RANK='-1' is below 0"),
        ({"LOCAL_WORLD_SIZE": "16"}, "LOCAL_WORLD_SIZE=16 is above WORLD_SIZE=8"),
    ],
)
def test_inconsistent_values_name_the_variable(change, message):
    with pytest.raises(ShoalError, match=message) as err:
        TorchrunEnvironment.describe(TORCHRUN | change, argv=NO_ARGV)
    assert err.value.hint


def test_run_id_without_rank_names_what_is_missing():
    with pytest.raises(ShoalError, match="torchrun: RANK, WORLD_SIZE, MASTER_ADDR not set"):
        TorchrunEnvironment.describe({"TORCHELASTIC_RUN_ID": "x"}, argv=NO_ARGV)
