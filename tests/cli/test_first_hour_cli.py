"""The small things a newcomer meets first (issue 38): near-miss names, help texts that fit the
command, and what ``shoal launch`` renders for the interpreter, preemption and a missing script.
In-process: nothing here starts a worker."""

from __future__ import annotations

import sys

import pytest

from shoal.cli.launch import main_raw as launch
from shoal.cli.main import build_parser, main


@pytest.mark.parametrize(
    "argv, lines",
    [
        (
            ["trian"],
            [
                "shoal: error: unknown command 'trian' (commands: train, run, launch, env, demo, doctor, bench, status)",
                "HINT: did you mean `shoal train`?",
            ],
        ),
        (["train", "digts"], ["shoal: error: unknown workload 'digts'", "HINT: did you mean `shoal train digits`?"]),
        (
            ["zzz"],
            [
                "shoal: error: unknown command 'zzz' (commands: train, run, launch, env, demo, doctor, bench, status)",
                "HINT: see `shoal --help`",
            ],
        ),
    ],
)
def test_near_misses_get_a_did_you_mean(capsys, argv, lines):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == lines and captured.out == ""


def test_help_texts_fit_the_command(capsys):
    from shoal.workloads import WORKLOADS

    shoal_help = build_parser().format_help()
    assert "language" in WORKLOADS and f"({', '.join(WORKLOADS)}, or your" in " ".join(shoal_help.split())
    with pytest.raises(SystemExit):
        launch(["slurm", "--help"])
    text = capsys.readouterr().out
    examples = text[text.index("examples:\n") :].split("\n\n")[0].splitlines()[1:]
    assert len(examples) >= 3 and all(line.startswith("  shoal launch slurm ") for line in examples), examples
    with pytest.raises(SystemExit):
        main(["bench", "scaling", "--help"])
    text = capsys.readouterr().out
    assert "launch_local" not in text and "how the workers start: auto" in " ".join(text.split())


def test_sbatch_names_this_interpreter_and_asks_for_the_preemption_signal(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert launch(["slurm", "--nodes", "2", "--dry-run", "--", "train.py", "--lr", "0.1"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert "#SBATCH --signal=USR1@60" in lines
    assert lines[-5:] == [
        "srun --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 \\",
        f'    {sys.executable} -m shoal run --nnodes "$SLURM_NNODES" --nproc 1 \\',
        "    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \\",
        '    --rdzv-backend c10d --rdzv-endpoint "$head_node:$port" --rdzv-id "$SLURM_JOB_ID" \\',
        "    train.py --lr 0.1",
    ]


@pytest.mark.parametrize(
    "argv, where",
    [
        (["slurm", "--dry-run", "--", "missing.py"], "every node"),
        (["k8s", "--image", "img:1", "--dry-run", "--", "python", "missing.py"], "the image"),
        (["image", "--dry-run", "--", "missing.py"], "the image"),
    ],
)
def test_a_script_missing_here_is_a_warning(capsys, tmp_path, monkeypatch, argv, where):
    monkeypatch.chdir(tmp_path)
    assert launch(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "missing.py" in line]
    assert warnings == [
        f"shoal launch: warning: missing.py (working directory {tmp_path}) does not exist here; every "
        f"process will fail unless {where} holds it"
    ]


def test_the_image_says_what_it_assumes_or_installs_the_checkout(capsys, tmp_path, monkeypatch):
    from importlib.metadata import version

    from shoal.jobs.kubernetes.image import DEFAULT_BASE_IMAGE, base_image_torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    here = version("torch").split("+")[0]
    assert launch(["image", "--dry-run", "--", "train.py"]) == 0
    captured = capsys.readouterr()
    dockerfile = captured.out.split("# ---- .dockerignore")[0]
    if base_image_torch(DEFAULT_BASE_IMAGE) != here:  # said on the terminal and in the Dockerfile
        note = (
            f"the base image holds torch {base_image_torch(DEFAULT_BASE_IMAGE)}, this machine runs torch {here}: "
            f"pass --base-image with a pytorch/pytorch:{here} tag to train with the same torch"
        )
        assert f"shoal launch: warning: {note}" in captured.err.splitlines()
        assert f"# NOTE: {note}" in dockerfile.splitlines()
    # A matching base image and a wheel of this directory: no note, the wheel copied in, then installed.
    (tmp_path / "shoal-0.1.0-py3-none-any.whl").write_bytes(b"")
    argv = ["image", "--dry-run", "--base-image", f"pytorch/pytorch:{here}-cpu"]
    assert launch([*argv, "--shoal-requirement", "shoal-0.1.0-py3-none-any.whl", "--", "train.py"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.split("# ---- .dockerignore")[0].splitlines()
    assert lines[lines.index("WORKDIR /workspace") + 1 :][:3] == [
        "COPY shoal-0.1.0-py3-none-any.whl ./shoal-0.1.0-py3-none-any.whl",
        "RUN pip install --no-cache-dir ./shoal-0.1.0-py3-none-any.whl",
        "COPY . ./",
    ]
    assert not any(line.startswith("# NOTE") for line in lines)
