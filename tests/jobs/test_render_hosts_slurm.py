"""Renderers of :mod:`shoal.jobs.hosts` and :mod:`shoal.jobs.slurm` pinned by golden files, and ``shoal launch`` parsing.

Each case below renders one job description; its text must equal ``golden/<case>.txt``. After an
intended change to a renderer, regenerate the files and review the diff before committing::

    SHOAL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/jobs/test_render_hosts_slurm.py
    git diff tests/jobs/golden/

Everything here runs in-process and starts nothing (``--dry-run``, or errors before launching).
"""

from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from shoal.cli import launch as launch_cli
from shoal.cli.launch.common import write_rendered
from shoal.errors import ShoalError
from shoal.jobs.hosts.options import (
    Here,
    Host,
    HostsOptions,
    forwarded_env,
    interpreter_first,
    parse_hosts,
    read_hostfile,
)
from shoal.jobs.hosts.render import render_manual, render_mpirun, render_ssh
from shoal.jobs.slurm import SBATCH_MARKER, SlurmOptions, render_sbatch
from shoal.jobs.spec import JobSpec, parse_env

GOLDEN = Path(__file__).parent / "golden"
TRAIN = ("shoal", "train", "digits", "--epochs", "1")
TWO_NODES = (Host("node1", 2), Host("node2", 2))
HEAD_AS_ROOT = Here(is_root=True, cores=2, hostname="head")
LAPTOP = Here(is_root=False, cores=2, hostname="laptop")


def _lines(argvs) -> str:
    return "\n".join(shlex.join(argv) for argv in argvs)


CASES = {
    "mpirun_hosts": lambda: shlex.join(
        render_mpirun(
            JobSpec(command=TRAIN, env=(("PATH", None), ("LD_LIBRARY_PATH", None))),
            HostsOptions(hosts=TWO_NODES),
            HEAD_AS_ROOT,
        )
    ),
    "mpirun_local_oversubscribed": lambda: shlex.join(
        render_mpirun(JobSpec(command=("train.py", "--lr", "0.1"), env=(("PATH", None),)), HostsOptions(np=4), LAPTOP)
    ),
    "mpirun_hostfile_rsh": lambda: shlex.join(
        render_mpirun(
            JobSpec(command=("-m", "mypkg.train"), master_port=23456, env=(("PATH", None), ("NCCL_DEBUG", "INFO"))),
            HostsOptions(
                hosts=(Host("10.0.0.1", 4), Host("10.0.0.2", 4)), hostfile="hosts.txt", rsh="/usr/local/bin/my-rsh"
            ),
            HEAD_AS_ROOT,
        )
    ),
    "mpirun_local_host_more_slots_than_cores": lambda: shlex.join(
        render_mpirun(
            JobSpec(command=("python", "-c", "print('hi there')")), HostsOptions(hosts=(Host("laptop", 4),)), LAPTOP
        )
    ),
    "sbatch_launcher_per_node": lambda: render_sbatch(
        JobSpec(
            command=("shoal", "train", "cifar10", "--data", "~/my data"),
            nodes=2,
            gpus_per_node=4,
            nproc=4,
            job_name="cifar",
            env=(("NCCL_DEBUG", "INFO"), ("PATH", None)),
            max_restarts=1,
        ),
        SlurmOptions(cpus_per_node=32, partition="gpu", time_limit="1:00:00"),
    ),
    "sbatch_launcher_fixed_port": lambda: render_sbatch(
        JobSpec(
            command=("train.py", "--lr", "0.1"),
            nodes=1,
            nproc=2,
            master_port=29555,
            workdir="/scratch/run",
        ),
        SlurmOptions(output="/scratch/logs/%x-%j.out", error="/scratch/logs/%x-%j.err"),
    ),
    "sbatch_one_task_per_process": lambda: render_sbatch(
        JobSpec(
            command=TRAIN,
            nodes=2,
            nproc=4,
            gpus_per_node=4,
        ),
        SlurmOptions(cpus_per_node=32, one_task_per_process=True, time_limit="30", partition="gpu"),
    ),
    "manual_static": lambda: "\n".join(
        render_manual(
            JobSpec(
                command=("train.py", "--lr", "0.1"),
                env=(("OMP_NUM_THREADS", "8"), ("PATH", None), ("TAG", "a b")),
            ),
            HostsOptions(hosts=(Host("node1", 4), Host("node2", 2))),
        )
    ),
    "manual_c10d": lambda: "\n".join(
        render_manual(
            JobSpec(
                command=TRAIN,
                rdzv_backend="c10d",
                master_addr="10.0.0.1",
                master_port=29400,
                max_restarts=2,
                job_name="digits",
            ),
            HostsOptions(hosts=TWO_NODES),
        )
    ),
    "manual_program": lambda: "\n".join(
        render_manual(
            JobSpec(command=("./bin/train", "--steps", "10")),
            HostsOptions(hosts=(Host("fd00::1", 1), Host("fd00::2", 1))),
        )
    ),
    "ssh_from_head": lambda: _lines(
        render_ssh(
            JobSpec(
                command=TRAIN,
                workdir="/home/me/proj",
                shoal=("/opt/venv/bin/python", "-m", "shoal"),
                env=(("PATH", None), ("UNSET", None), ("A", "1")),
            ),
            HostsOptions(hosts=(Host("head", 2), Host("node2", 2))),
            HEAD_AS_ROOT,
            {"PATH": "/opt/venv/bin:/usr/bin"},
        )
    ),
    "ssh_rsh_c10d": lambda: _lines(
        render_ssh(
            JobSpec(command=("train.py",), rdzv_backend="c10d"),
            HostsOptions(hosts=TWO_NODES, rsh="ip netns exec-wrapper --quiet"),
            HEAD_AS_ROOT,
            {},
        )
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = CASES[case]().rstrip("\n") + "\n"
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("SHOAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: regenerate with SHOAL_UPDATE_GOLDEN=1 (see the module docstring)"
    assert text == path.read_text(), f"{case} differs from {path}: review, then regenerate if intended"


def test_no_golden_file_is_stale():
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(CASES)


# ---- what the renderings must contain (independent of the golden text) -----------------------


def test_mpirun_flags_the_tutorials_use():
    argv = render_mpirun(JobSpec(command=TRAIN, env=(("PATH", None),)), HostsOptions(hosts=TWO_NODES), HEAD_AS_ROOT)
    text = shlex.join(argv)
    for flags in (
        "-np 4",
        "-H node1:2,node2:2",
        "--allow-run-as-root",
        "-bind-to none",
        "-map-by slot",
        "-mca pml ob1",
        "-mca btl '^openib'",
        "-x MASTER_ADDR=node1",
        "-x MASTER_PORT=29500",
        "-x PATH",
    ):
        assert flags in text
    assert "--oversubscribe" not in text
    assert argv[-5:] == list(TRAIN)
    assert "--allow-run-as-root" not in render_mpirun(JobSpec(command=TRAIN), HostsOptions(np=2), LAPTOP)


def test_every_mpirun_rank_gets_torchruns_variables_through_the_shim():
    # An unchanged torchrun-style script reads RANK, LOCAL_RANK, GROUP_RANK...: each rank runs the
    # command through the shim that derives them from Open MPI's variables.
    argv = render_mpirun(JobSpec(command=("train.py",), python="py"), HostsOptions(hosts=TWO_NODES), HEAD_AS_ROOT)
    assert argv[-6:] == ["py", "-m", "shoal.launch.as_torchrun", "--", "py", "train.py"]
    # Hosts with different slot counts: Open MPI's variables cannot tell a node's index, the layout can.
    uneven = HostsOptions(hosts=(Host("a", 2), Host("b", 1), Host("c", 4)), np=4)
    argv = render_mpirun(JobSpec(command=("train.py",), python="py"), uneven, HEAD_AS_ROOT, report_status=True)
    assert argv[-8:] == [
        "py",
        "-m",
        "shoal.jobs.hosts.rank_status",
        "--ranks-per-node",
        "2,1,1",
        "--",
        "py",
        "train.py",
    ]


def test_sbatch_runs_one_launcher_per_node_with_c10d_on_the_first_node():
    script = render_sbatch(JobSpec(command=TRAIN, nodes=3, nproc=2), SlurmOptions())
    assert script.startswith("#!/bin/bash\n") and SBATCH_MARKER in script
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2\n" in script
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in script
    assert "srun --ntasks-per-node=1" in script
    assert '--rdzv-backend c10d --rdzv-endpoint "$head_node:$port"' in script
    assert '--nnodes "$SLURM_NNODES" --nproc 2' in script
    assert script.rstrip().endswith("-m shoal train digits --epochs 1")


def test_launcher_target_for_each_kind_of_command():
    def target(*command):
        return JobSpec(command=command).launcher_target()

    assert target("shoal", "train", "mnist") == ["-m", "shoal", "train", "mnist"]
    assert target("/opt/venv/bin/shoal", "train") == ["-m", "shoal", "train"]
    assert target("train.py", "--lr", "1") == ["train.py", "--lr", "1"]
    assert target("-m", "pkg.mod", "x") == ["-m", "pkg.mod", "x"]
    assert target("python3", "train.py") == ["train.py"]
    assert target("python", "-m", "pkg") == ["-m", "pkg"]
    assert target("python", "-c", "print(1)") == ["--no-python", "python", "-c", "print(1)"]
    assert target("./a.out", "1") == ["--no-python", "./a.out", "1"]
    assert JobSpec(command=("train.py",), python="python3").process_argv() == ["python3", "train.py"]
    assert JobSpec(command=("shoal", "train")).process_argv() == ["shoal", "train"]


# ---- parsing and validation ----------------------------------------------------------------


def test_parse_hosts():
    assert parse_hosts("node1:2,node2:2") == TWO_NODES
    assert parse_hosts("a, b:3", default_slots=4) == (Host("a", 4), Host("b", 3))
    assert parse_hosts("[fd00::1]:2,10.0.0.2") == (Host("fd00::1", 2), Host("10.0.0.2", 1))
    assert str(Host("fd00::1", 2)) == "[fd00::1]:2"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "--hosts is empty"),
        ("node1:x", "slots 'x' is not a whole number"),
        ("node1:0", "slots '0' is not a whole number of at least 1"),
        ("node1:2,,node2", "has no valid host name"),
        (":2", "has no valid host name"),
        ("fd00::1:2", "an IPv6 address needs brackets"),
        ("no/de:2", "has no valid host name"),
    ],
)
def test_malformed_hosts(text, message):
    with pytest.raises(ShoalError, match=message) as err:
        parse_hosts(text)
    assert "node1:2,node2:2" in err.value.hint


def test_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode1 slots=4 max_slots=8\n\nnode2:2   # a comment\n")
    assert read_hostfile(str(path)) == (Host("node1", 4), Host("node2", 2))
    path.write_text("node1\n")
    with pytest.raises(ShoalError, match="line 1: node1 has no slots=N"):
        read_hostfile(str(path))
    path.write_text("node1 cpus=4\n")
    with pytest.raises(ShoalError, match="unknown field 'cpus=4'"):
        read_hostfile(str(path))
    with pytest.raises(ShoalError, match="cannot read hostfile"):
        read_hostfile(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: JobSpec(command=()), "no command given"),
        (lambda: HostsOptions(hosts=(Host("a", 1), Host("a", 2))), "host listed twice: a"),
        (
            lambda: render_manual(JobSpec(command=TRAIN), HostsOptions(hosts=(Host("localhost", 2), Host("node2", 2)))),
            "the first host is localhost",
        ),
        (lambda: HostsOptions(np=0), "-np must be at least 1"),
        (lambda: JobSpec(command=TRAIN, master_port=70000), "port 70000 is not a TCP port"),
        (lambda: SlurmOptions(time_limit="1h"), "not a Slurm time limit"),
        (lambda: SlurmOptions(cpus_per_node=0), "CPUs per node must be at least 1"),
        (lambda: JobSpec(command=TRAIN, env=(("1BAD", "x"),)), "is not a variable name"),
        (lambda: JobSpec(command=TRAIN, nodes=0), "nodes must be at least 1"),
        (lambda: JobSpec(command=TRAIN, rdzv_backend="etcd"), "unknown rendezvous"),
    ],
)
def test_bad_job_descriptions(make, message):
    with pytest.raises(ShoalError, match=message) as err:
        make()
    assert err.value.hint


def test_env_forwarding():
    extra = parse_env(["NCCL_DEBUG=INFO", "HOME", "PATH=/x"])
    assert extra == (("NCCL_DEBUG", "INFO"), ("HOME", None), ("PATH", "/x"))
    assert forwarded_env({"PATH": "/bin", "PYTHONPATH": "/p", "OTHER": "1"}, extra) == (
        ("PYTHONPATH", None),
        ("NCCL_DEBUG", "INFO"),
        ("HOME", None),
        ("PATH", "/x"),
    )


def test_the_interpreter_running_shoal_leads_the_forwarded_path():
    env = forwarded_env({"PATH": "/usr/bin:/opt/venv/bin"}, (("A", "1"),))
    assert interpreter_first(env, {"PATH": "/usr/bin:/opt/venv/bin"}, "/opt/venv/bin/python") == (
        ("A", "1"),
        ("PATH", "/opt/venv/bin:/usr/bin"),
    )
    explicit = (("PATH", "/mine"),)
    assert interpreter_first(explicit, {"PATH": "/usr/bin"}, "/opt/venv/bin/python") == explicit


def test_here_knows_its_own_addresses():
    here = Here.detect((Host("127.0.0.1", 1), Host("198.51.100.77", 1), Host("node9", 1)))
    assert here.is_local("127.0.0.1") and here.is_local("localhost") and here.is_local(here.hostname)
    assert not here.is_local("node9") and not here.is_local("198.51.100.77")


# ---- the CLI: --dry-run prints the rendering; bad input is one ShoalError -----------------------


def _dry(capsys, *argv):
    assert launch_cli.main_raw(list(argv)) == 0
    return capsys.readouterr().out


def test_cli_hosts_dry_run_via_mpirun(capsys):
    out = _dry(capsys, "--hosts", "node1:2,node2:2", "--via", "mpirun", "--dry-run", "--", *TRAIN)
    argv = shlex.split(out)
    assert argv[:5] == ["mpirun", "-np", "4", "-H", "node1:2,node2:2"]
    assert argv[-5:] == list(TRAIN) and "MASTER_ADDR=node1" in argv
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)
    # Each rank reports its status through this interpreter (shoal launch tells the cause from the
    # ranks stopped because of it), and mpirun lets shoal decide when to stop the job.
    assert argv[-9:-5] == [sys.executable, "-m", "shoal.jobs.hosts.rank_status", "--"]
    assert "orte_abort_on_non_zero_status" in argv
    # The interpreter's directory leads the PATH every rank gets, even without an activated venv.
    path = next(a for a in argv if a.startswith("PATH="))
    assert path.split("=", 1)[1].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_cli_hosts_dry_run_via_ssh(capsys):
    out = _dry(
        capsys, "--hosts", "node1,node2", "--nproc-per-node", "3", "--via", "ssh", "--dry-run", "train.py", "--dry-run"
    )  # without --: the command's own flags stay its own
    lines = out.splitlines()
    assert lines[0] == "# node1:3" and lines[2] == "# node2:3"
    ssh = shlex.split(lines[3])
    assert ssh[:4] == ["ssh", "-o", "BatchMode=yes", "node2"]
    assert f"cd {os.getcwd()} || exit 1;" in ssh[4]
    assert (
        "-m shoal run --nnodes 2 --node-rank 1 --nproc 3 --master-addr node1 --master-port 29500 "
        "train.py --dry-run 3<&-" in ssh[4]
    )


def test_cli_mpirun_and_manual(capsys):
    out = _dry(capsys, "mpirun", "-np", "2", "--master-port", "23456", "--dry-run", "--", "train.py")
    argv = shlex.split(out)
    assert argv[:3] == ["mpirun", "-np", "2"] and "MASTER_ADDR=127.0.0.1" in argv and "MASTER_PORT=23456" in argv
    assert argv[-2:] == [sys.executable, "train.py"]  # the interpreter running shoal, not PATH's python
    out = _dry(capsys, "mpirun", "-np", "2", "--python", "python3", "--dry-run", "--", "train.py")
    assert shlex.split(out)[-2:] == ["python3", "train.py"]
    out = _dry(capsys, "manual", "--hosts", "a:2,b:1", "--", "shoal", "train")
    assert out.splitlines() == [
        "# on a (node 0 of 2):",
        "shoal run --nnodes 2 --node-rank 0 --nproc 2 --master-addr a --master-port 29500 -m shoal train",
        "# on b (node 1 of 2):",
        "shoal run --nnodes 2 --node-rank 1 --nproc 1 --master-addr a --master-port 29500 -m shoal train",
    ]


def test_cli_mpirun_inside_a_slurm_allocation(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[03-04]")
    argv = shlex.split(_dry(capsys, "mpirun", "-np", "8", "--dry-run", "--", "train.py"))
    assert "MASTER_ADDR=gpu03" in argv and "MASTER_PORT=29500" in argv  # rank 0 runs on the first node


def test_cli_slurm_dry_run(capsys):
    out = _dry(capsys, "slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "1:00:00", "--dry-run", "--", *TRAIN)
    assert "#SBATCH --gpus-per-node=4\n" in out and "--nproc 4" in out  # one process per GPU by default
    out = _dry(
        capsys, "slurm", "--nodes", "2", "--nproc-per-node", "2", "--one-task-per-process", "--dry-run", "--", *TRAIN
    )
    assert "#SBATCH --ntasks-per-node=2\n" in out and out.rstrip().endswith(shlex.join(TRAIN))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hosts", "node1:2", "--dry-run"], "no command given"),
        (["--hosts", "node1:2", "--dry-run", "--"], "no command given"),
        (["--dry-run", "--", "train.py"], "no hosts given"),
        (["--hosts", "node1:two", "--", "train.py"], "slots 'two' is not a whole number"),
        (["--hosts", "a:1", "--hostfile", "f", "--", "train.py"], "--hosts and --hostfile both given"),
        (
            ["--hosts", "a:1", "--via", "mpirun", "--rdzv", "c10d", "--dry-run", "--", "x.py"],
            "--rdzv-backend and --max-restarts",
        ),
        (["mpirun", "--dry-run", "--", "train.py"], "no process count"),
        (["slurm", "--nodes", "0", "--", "train.py"], "nodes must be at least 1"),
        (["slurm", "--one-task-per-process", "--max-restarts", "1", "--", "x.py"], "--max-restarts needs"),
        (["manual", "--", "train.py"], "no hosts given"),
    ],
)
def test_cli_bad_input(argv, message):
    with pytest.raises(ShoalError, match=message) as err:
        launch_cli.main_raw(argv)
    assert err.value.hint and "\n" not in err.value.message


def test_cli_missing_mpirun_and_sbatch(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither mpirun nor sbatch nor ssh here
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ShoalError, match="mpirun not found on PATH") as err:
        launch_cli.main_raw(["mpirun", "-np", "2", "--", "train.py"])
    assert "openmpi-bin" in err.value.hint
    with pytest.raises(ShoalError, match="mpirun not found on PATH"):
        launch_cli.main_raw(["--hosts", "a:1,b:1", "--via", "mpirun", "--", "train.py"])
    with pytest.raises(ShoalError, match="sbatch not found on PATH") as err:
        launch_cli.main_raw(["slurm", "--", "train.py"])
    assert "--dry-run" in err.value.hint
    assert not (tmp_path / "shoal.sbatch").exists()  # nothing written when it cannot be submitted
    with pytest.raises(ShoalError, match="ssh not found on PATH"):  # --via auto: no mpirun, so ssh
        launch_cli.main_raw(["--hosts", "a:1,b:1", "--", "train.py"])


def test_sbatch_script_never_overwrites_a_foreign_file(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\necho mine\n")
    with pytest.raises(ShoalError, match="exists and was not written by shoal"):
        write_rendered(str(path), "new", SBATCH_MARKER, what="shoal launch slurm", mode=0o755)
    assert path.read_text() == "#!/bin/bash\necho mine\n"
    path.write_text(f"#!/bin/bash\n{SBATCH_MARKER}: old\n")
    write_rendered(str(path), f"{SBATCH_MARKER}: new\n", SBATCH_MARKER, what="shoal launch slurm", mode=0o755)
    assert path.read_text().endswith("new\n") and path.stat().st_mode & stat.S_IXUSR


def test_register_on_a_fresh_parser(capsys):
    """What ``shoal``'s main parser does once ``launch`` is registered there."""
    parser = argparse.ArgumentParser(prog="shoal")
    launch_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["launch", "--hosts", "n1:1,n2:1", "--via", "mpirun", "--dry-run", "--", "x.py", "-h"])
    assert args.func(args) == 0
    assert shlex.split(capsys.readouterr().out)[-3:] == [sys.executable, "x.py", "-h"]
    assert "launch" in parser.format_help()
