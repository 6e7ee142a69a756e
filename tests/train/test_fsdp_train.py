"""``shoal train --strategy fsdp``: FSDP2 through the trainer, with real workers over gloo.

One FSDP run and one DDP run of the language workload (TinyGPT tiny, 2 workers, the same seed, 52
steps, a checkpoint every 13) are made once and reused: exact evaluation, the plain model.pt, FSDP vs
DDP losses, and the checkpoints the resume tests start from (resharding to 1 and 3 workers, a DDP
checkpoint into FSDP and back). Every launch costs a few seconds of start-up (three Python processes
importing torch), which is most of this file's time.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from memory_demo import SAMPLES as LARGE_SAMPLES
from memory_demo import train_large

from cgroups import memory_cgroup
from conftest import run_shoal
from procs import kill_group, start, wait_for

SAMPLES = 808  # 101 test windows: 51 and 50 on 2 ranks, 6 and 5 batches of 10 (FSDP's fillers run)
COMMON = ["language", "--arch", "tiny", "--device", "cpu", "--seed", "3", "--epochs", "2", "--samples", str(SAMPLES)]
COMMON += ["--batch-size", "16", "--eval-batch-size", "10", "--no-progress", "--checkpoint-every", "13steps"]
COMMON += ["--keep", "10"]  # every checkpoint stays: the resume tests start from those of the reference runs
STEPS_PER_EPOCH = 26  # 808 windows / (16 x 2), the last batch short


def _train(out: Path, *extra: str, timeout: float = 240):
    result = run_shoal("train", *COMMON, "--out", str(out), *extra, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", weights_only=True)


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, different


def _sharded(out: Path) -> list[Path]:
    return sorted((out / "checkpoints").glob("ckpt-*.dcp"))


def _continue_from(checkpoint: Path, out: Path) -> None:
    """``out`` a new run directory whose checkpoints hold a copy of ``checkpoint`` (``--resume auto``
    then starts there)."""
    (out / "checkpoints").mkdir(parents=True)
    copy = shutil.copytree if checkpoint.is_dir() else shutil.copy2
    copy(checkpoint, out / "checkpoints" / checkpoint.name)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp") / "run"
    result = _train(out, "--strategy", "fsdp", "--nproc", "2")
    assert "model sharded by FSDP over 2 processes" in result.stdout
    return out


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    _train(out, "--strategy", "ddp", "--nproc", "2")
    return out


@pytest.mark.multiprocess
def test_fsdp_trains_the_transformer_with_exact_evaluation_and_a_plain_model_pt(fsdp_run):
    from shoal.workloads.language import Language
    from shoal.workloads.language_model import TinyGPT, lm_loss

    first, second = _metrics(fsdp_run)
    assert first["samples_seen"] == second["samples_seen"] == SAMPLES and second["world_size"] == 2
    assert second["train_loss"] < first["train_loss"] < math.log(256)
    assert json.loads((fsdp_run / "config.json").read_text())["strategy"] == "fsdp"
    assert _sharded(fsdp_run), "FSDP checkpoints are sharded (.dcp directories)"
    assert not list((fsdp_run / "checkpoints").glob("*.pt"))
    # model.pt: a plain state dict (no DTensor, no prefix) that loads, strictly, into the plain model
    # in one process without a process group; its loss on the whole test set is the one the two
    # ranks reported (exact evaluation: every test window once, the fillers counted nowhere).
    state = _weights(fsdp_run)
    assert all(type(t) is torch.Tensor for t in state.values())
    assert not any(key.startswith(("module.", "_orig_mod.", "_fsdp")) for key in state)
    model = TinyGPT.preset("tiny")
    model.load_state_dict(state)
    model.eval()
    cfg = SimpleNamespace(arch="tiny", samples=SAMPLES, seed=3, data=None, download=False)
    inputs, targets = Language().load(cfg, torch.device("cpu")).test
    assert len(inputs) == 101
    with torch.no_grad():
        loss = float(lm_loss(model(inputs), targets))
    assert loss == pytest.approx(second["test_loss"], rel=1e-6)


@pytest.mark.multiprocess
def test_fsdp_and_ddp_from_the_same_seed_have_the_same_losses(fsdp_run, ddp_run):
    """52 steps. Both average the same float32 gradients; only the reduction order may differ
    (DDP all-reduces buckets, FSDP reduce-scatters per block). With 2 ranks each gradient element is
    one addition of two numbers and a division by 2, both exactly rounded, so the runs agree to the
    bit (measured); the tolerance, 1e-6 relative, allows for a few float32 ulps (6e-8) of
    reduction-order noise per step on another build, and is far below a real divergence (> 1e-3 in a
    few steps)."""
    fsdp, ddp = _metrics(fsdp_run), _metrics(ddp_run)
    for a, b in zip(fsdp, ddp):
        for key in ("train_loss", "test_loss", "test_accuracy", "test_perplexity"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), (key, a[key], b[key])
    a, b = _weights(fsdp_run), _weights(ddp_run)
    assert a.keys() == b.keys()
    # Weights: Adam divides by sqrt(v), so a near-zero gradient's noise moves a weight by up to lr.
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


@pytest.mark.multiprocess
def test_kill_9_mid_run_then_resume_is_bit_identical(fsdp_run, tmp_path):
    """The whole launcher's process group SIGKILLed after the first sharded checkpoint; the same
    command resumes it to the uninterrupted run's weights, bit for bit, every sample seen once per
    epoch. Its checkpoints are written in the background (--async-checkpoint), the reference's not:
    how a checkpoint is written changes nothing in the run."""
    out = tmp_path / "killed"
    args = ["--out", str(out), "--strategy", "fsdp", "--nproc", "2", "--async-checkpoint"]
    proc = start("train", *COMMON, *args)
    wait_for(lambda: bool(_sharded(out)) or proc.poll() is not None, timeout=180)
    assert proc.poll() is None, "the run ended before it could be killed"
    kill_group(proc, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (out / "model.pt").exists()
    again = run_shoal("train", *COMMON, *args, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from" in again.stdout and "sharded, written in the background" in again.stdout
    _assert_identical(_weights(out), _weights(fsdp_run))
    assert [m["samples_seen"] for m in _metrics(out)] == [SAMPLES, SAMPLES]
    assert [m["test_loss"] for m in _metrics(out)] == [m["test_loss"] for m in _metrics(fsdp_run)]


def _resharded(fsdp_run: Path, out: Path, world: int, *extra: str) -> list[dict]:
    """The 2-rank run's checkpoint of step 13 (mid-epoch 1) continued on ``world`` workers."""
    (source,) = [path for path in _sharded(fsdp_run) if path.name.endswith("-s000000013.dcp")]
    _continue_from(source, out)
    resumed = _train(out, "--strategy", "fsdp", "--nproc", str(world), *extra)
    assert f"resuming from {out / 'checkpoints' / source.name}: epoch 1, step 13" in resumed.stdout
    records = _metrics(out)
    assert [r["epoch"] for r in records] == [1, 2] and records[-1]["world_size"] == world
    # Every sample once per epoch: those the 2 ranks saw before the checkpoint, the rest after it.
    assert [r["samples_seen"] for r in records] == [SAMPLES, SAMPLES]
    return records


@pytest.mark.multiprocess
def test_resharded_from_2_workers_to_1(fsdp_run, tmp_path):
    """On 1 process with the same global batch (32): the same batches, so the same run up to the
    order of the gradient sum (2 halves added by gloo vs one sum), which Adam's g / sqrt(v)
    magnifies where g is near 0: the weights stay within 1e-4, the losses within 1e-5."""
    records = _resharded(fsdp_run, tmp_path / "on1", 1, "--batch-size", "32")
    for a, b in zip(records, _metrics(fsdp_run)):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)
    a, b = _weights(tmp_path / "on1"), _weights(fsdp_run)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resharded_from_2_workers_to_3(fsdp_run, tmp_path):
    records = _resharded(fsdp_run, tmp_path / "on3", 3)
    assert records[-1]["train_loss"] < records[0]["train_loss"]


@pytest.mark.multiprocess
def test_a_ddp_checkpoint_resumes_under_fsdp_and_an_fsdp_one_under_ddp(fsdp_run, ddp_run, tmp_path):
    """A .pt from the DDP run (mid-epoch 1) continued with --strategy fsdp, and a .dcp of the FSDP
    run continued with --strategy ddp, each end on the weights of the run it came from (which are
    the same: the runs agree to the bit at 2 ranks, see above)."""
    (from_ddp,) = (ddp_run / "checkpoints").glob("ckpt-*-s000000013.pt")
    from_fsdp = _sharded(fsdp_run)[0]
    _continue_from(from_ddp, tmp_path / "ddp-to-fsdp")
    _continue_from(from_fsdp, tmp_path / "fsdp-to-ddp")
    _train(tmp_path / "ddp-to-fsdp", "--strategy", "fsdp", "--nproc", "2")
    _train(tmp_path / "fsdp-to-ddp", "--strategy", "ddp", "--nproc", "2")
    for out, source in ((tmp_path / "ddp-to-fsdp", ddp_run), (tmp_path / "fsdp-to-ddp", fsdp_run)):
        a, b = _weights(out), _weights(source)
        assert a.keys() == b.keys()
        assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6, out.name
        assert _metrics(out)[-1]["test_loss"] == pytest.approx(_metrics(source)[-1]["test_loss"], rel=1e-6)


@pytest.mark.multiprocess
def test_a_rank_without_a_test_sample_joins_the_fsdp_evaluation(tmp_path):
    """8 training windows give 1 test window: rank 1 has none and runs a filler forward (counted
    nowhere) so that rank 0's all-gathers complete; the metrics' names come from the filler too."""
    from shoal.workloads.language import Language
    from shoal.workloads.language_model import TinyGPT, lm_loss

    out = tmp_path / "one"
    args = ["language", "--arch", "tiny", "--samples", "8", "--batch-size", "4", "--epochs", "1", "--device", "cpu"]
    args += ["--checkpoint-every", "off", "--strategy", "fsdp", "--nproc", "2", "--out", str(out)]
    result = run_shoal("train", *args, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    (record,) = _metrics(out)
    model = TinyGPT.preset("tiny")
    model.load_state_dict(_weights(out))
    cfg = SimpleNamespace(arch="tiny", samples=8, seed=0, data=None, download=False)
    inputs, targets = Language().load(cfg, torch.device("cpu")).test
    assert len(inputs) == 1
    with torch.no_grad():
        assert float(lm_loss(model(inputs), targets)) == pytest.approx(record["test_loss"], rel=1e-6)


@pytest.mark.multiprocess
def test_fsdp_trains_a_resnet_with_exact_evaluation(tmp_path):
    """A torchvision ResNet-18 (synthetic images), sharded stage by stage: the test loss the ranks
    report is model.pt's on the whole test set in one process (BatchNorm's statistics are rank 0's
    on every rank when evaluating)."""
    from shoal.workloads.synthetic import Synthetic, build_synthetic_model

    out = tmp_path / "resnet"
    args = ["synthetic", "--arch", "resnet18", "--image-size", "16", "--samples", "64", "--epochs", "1"]
    args += ["--batch-size", "8", "--eval-batch-size", "3", "--device", "cpu", "--checkpoint-every", "off"]
    result = run_shoal("train", *args, "--strategy", "fsdp", "--nproc", "2", "--out", str(out), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (record,) = _metrics(out)
    cfg = SimpleNamespace(arch="resnet18", image_size=16, samples=64, seed=0, data=None, download=False)
    data = Synthetic().load(cfg, torch.device("cpu"))
    model = build_synthetic_model("resnet18", 16, data.num_classes)
    model.load_state_dict(_weights(out))
    model.eval()
    inputs, targets = data.test
    with torch.no_grad():
        logits = model(inputs)
    assert float(torch.nn.functional.cross_entropy(logits, targets)) == pytest.approx(record["test_loss"], rel=1e-5)
    assert float((logits.argmax(1) == targets).double().mean()) == record["test_accuracy"]


NO_PARAMETERS = """\
import torch
from torch import nn
import shoal


class Frozen(shoal.Workload):
    name = "frozen"

    def load(self, cfg, device, rank=0):
        x = torch.randn(16, 4)
        return shoal.WorkloadData(train=(x, torch.zeros(16, dtype=torch.long)), test=(x, torch.zeros(16, dtype=torch.long)), num_classes=4)

    def build_model(self, cfg, num_classes):
        return nn.Softmax(dim=1)
"""


@pytest.mark.parametrize(
    "args, first, hint",
    [
        (
            ["--strategy", "fsdp", "--comm-hook", "powersgd"],
            "--comm-hook powersgd works only with --strategy ddp",
            "drop --comm-hook",
        ),
        (["--strategy", "zero3"], "--strategy 'zero3' is not one of: ddp, fsdp", "choose one of: ddp, fsdp"),
        (["--strategy", "fsdp", "--amp", "fp16"], "--amp fp16 does not work with --strategy fsdp", "use --amp bf16"),
        (["--strategy", "fsdp", "--channels-last"], "--channels-last does not work with --strategy fsdp", "drop"),
    ],
)
def test_bad_strategy_input_is_one_line_and_a_hint_before_any_worker(tmp_path, args, first, hint):
    result = run_shoal("train", "digits", "--nproc", "2", "--out", str(tmp_path / "run"), *args, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"shoal: error: {first}"), lines
    assert lines[1].startswith(f"HINT: {hint}"), lines
    assert not (tmp_path / "run").exists()


def test_a_model_without_parameters_under_fsdp_is_one_line_and_a_hint(tmp_path):
    """Found when the model is wrapped (in each worker: with --nproc 2 each rank prints these two
    lines and the launcher's report follows); one process shows them alone."""
    (tmp_path / "frozen.py").write_text(NO_PARAMETERS)
    result = run_shoal(
        "train", "frozen.py:Frozen", "--strategy", "fsdp", "--device", "cpu", "--epochs", "1", "--out", "run",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[0] == "shoal: error: the model (Softmax) has no trainable parameters: there is nothing to shard"
    assert lines[1].startswith("HINT: use --strategy ddp"), lines


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_bf16_under_fsdp_on_gpus(tmp_path):
    """--amp bf16 with --strategy fsdp: FSDP's mixed precision (bf16 compute, float32 shards and
    reduction), no autocast; model.pt stays float32 and the loss falls as in float32."""
    nproc = str(min(2, torch.cuda.device_count()))
    out = tmp_path / "bf16"
    args = [("cuda" if a == "cpu" else a) for a in COMMON]
    result = run_shoal(
        "train", *args, "--strategy", "fsdp", "--amp", "bf16", "--nproc", nproc, "--out", str(out), timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(bf16 compute)" in result.stdout
    assert all(t.dtype == torch.float32 for t in _weights(out).values())
    first, second = _metrics(out)
    assert second["train_loss"] < first["train_loss"] < math.log(256)


# -- the memory limit: the large preset under DDP and under FSDP at 2 ranks --------------------------------

WORKER_LIMIT = 1152 << 20
"""What each of the 2 workers may use, torch included (their cgroup's limit is 2 x this plus the
launcher's share: 2.88 GiB, against peaks of 2.11 GiB under FSDP and 3.59 GiB under DDP)."""
LAUNCHER = 640 << 20
"""The launcher: Python, torch, the agent (its pages are shared with the forked workers until written)."""


@pytest.fixture
def memory_limit():
    """A fresh child of this process's memory cgroup (v1 or v2) limited to 2 workers' budget."""
    with memory_cgroup(2 * WORKER_LIMIT + LAUNCHER, "fsdp") as child:
        yield child


def _in_cgroup(cgroup: str, strategy: str, out: Path) -> tuple[int, str]:
    proc = train_large(cgroup, 2, strategy, str(out))
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
# Two launches of a 99.8 M-parameter model on 2 cores: CPU-bound work that took over 300 s (pytest's
# default guard) at load 25; each launch has its own 900 s guard (memory_demo.train_large).
@pytest.mark.timeout(1800)
def test_the_large_model_trains_under_fsdp_where_ddp_is_killed_for_memory(memory_limit, tmp_path):
    """TinyGPT large (99.8 M parameters: 1.6 GB of parameters, gradients and Adam state per worker
    under DDP, 0.8 GB under FSDP at 2) at 2 workers in 2 x 1.125 GiB (+ the launcher's 640 MiB):
    DDP's workers are OOM-killed and shoal says so; FSDP (its peak 2.11 GiB for the whole job,
    measured unlimited; DDP's 3.59 GiB) trains to the end. docs/BENCHMARKS.md, "Memory"."""
    code, out = _in_cgroup(memory_limit, "ddp", tmp_path / "ddp")
    assert code == 128 + signal.SIGKILL, out
    summary = next(line for line in out.splitlines() if line.startswith("shoal: error:"))
    assert "killed by SIGKILL" in summary and "the kernel's out-of-memory killer" in summary, out
    code, out = _in_cgroup(memory_limit, "fsdp", tmp_path / "fsdp")
    assert code == 0, out
    (record,) = _metrics(tmp_path / "fsdp")
    assert record["samples_seen"] == LARGE_SAMPLES and math.isfinite(record["test_loss"])
