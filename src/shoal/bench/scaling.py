"""``shoal bench scaling``: how throughput grows with the number of processes, and why not faster.

Workload: a torchvision ResNet (default ResNet-18, 10 classes) on random 3xSxS images (default
32x32), a fixed batch per process (weak scaling, default 32), plain SGD. Synthetic only for now:
the point is the cost of the processes and of the gradient all-reduce, not the data.

Every process is started through shoal's own launcher (:func:`shoal.launch.local.launch_local`) and
uses shoal's library (``shoal.init``, ``ctx.wrap``, ``ctx.loader`` over tensors), as a user's job
would. One launch per world size and repeat; the launches are interleaved (1, 2, 1, 2, ...) and the
median over repeats is reported. Inside a launch several *variants* take turns on the same
processes (after a warm-up of each, the timed steps run in ``--blocks`` blocks: A B C A B C ...;
see :mod:`shoal.bench.scaling_worker`):

* ``ddp``: the job as it is (DDP's gradient all-reduce after every backward);
* ``no_allreduce``: the same processes with DDP's gradient sync skipped (``no_sync``), a control
  that separates compute contention (processes slowing each other down) from communication;
* ``hook:<name>``: DDP with a gradient-compression hook (``--comm-hook bf16,powersgd``: any of bf16,
  fp16, powersgd), each on its own copy of the model so the plain ``ddp`` variant is measured beside
  it (PowerSGD compresses from step 2, after a longer warm-up: every timed step is compressed);
* ``torch_defaults``: DDP as ``DistributedDataParallel(model)`` builds it, without shoal's settings
  (``gradient_as_bucket_view``), on its own copy of the model: what those settings are worth;
* ``threads`` (CPU, in the 1-process launch): one process with T times the threads and T times the
  batch, to compare with T processes x 1 thread at equal total threads and equal global batch.

Across nodes (``--nnodes N --node-rank R --master-addr ADDR``, the same command on every node, one
process per node): each round launches 1 process on node 0 alone (the baseline; the other nodes skip
it and wait in the next launch's rendezvous) and N processes, one per node, over the network; node 0
prints the report. This is how the slow-link figures of docs/BENCHMARKS.md were measured
(``scripts/bench-slow-link`` runs it on two network namespaces joined by a rate-limited link).

Derived per row: ``speedup = tput / tput_1`` and ``efficiency = tput / (scale x tput_1)`` where
``tput_1`` is 1 process with the base thread count and ``scale`` is the row's total threads over the
base (the number of processes on GPU); ``time_reduction = 1 - tput_1 / tput`` is the time saved on a
fixed amount of work ("49.6% less time").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, flag, launch_workers, paired_ratio, require_at_least
from shoal.bench.scaling_verdict import verdict
from shoal.bench.scaling_worker import Variant, WorkerSpec, scaling_worker
from shoal.bench.timing import load_average, median, rotations
from shoal.env.host import usable_cores
from shoal.errors import ShoalError
from shoal.launch.local import check_start_method, resolve_start_method


def parse_hooks(text: str) -> tuple[str, ...]:
    """``--comm-hook bf16,powersgd`` -> ("bf16", "powersgd"); ``none`` adds nothing (names are checked later)."""
    return tuple(h.strip() for h in text.split(",") if h.strip() and h.strip() != "none")


@dataclass(frozen=True)
class ScalingConfig:
    """What ``shoal bench scaling`` measures."""

    world_sizes: tuple[int, ...] = field(
        default=(), metadata=flag(parse=rep.parse_int_list, metavar="N,N,...", default="1..cores")
    )
    """Comma-separated process counts to measure (1..GPUs on CUDA); 1 is always included."""
    arch: str = "resnet18"
    """Model to train: a torchvision ResNet (resnet18 ... resnet152) or mlp (the synthetic workload's)."""
    image_size: int = 32
    """Side of the random square RGB images."""
    batch_size: int = 32
    """Samples per process per step (weak scaling: the global batch grows with the processes)."""
    steps: int = 20
    """Timed steps per variant and launch."""
    warmup: int = 3
    """Untimed steps of each variant before any timing."""
    blocks: int = 4
    """The timed steps of a launch run in this many blocks, the variants taking turns."""
    repeat: int = 3
    """Launches per world size, interleaved; the median is reported."""
    threads: int = 1
    """Intra-op threads per process on CPU (the base is 1 process with this many)."""
    comm_hook: tuple[str, ...] = field(default=(), metadata=flag(parse=parse_hooks, metavar="HOOK,...", default="none"))
    """Also measure DDP with these gradient-compression hooks, comma-separated: bf16, fp16, powersgd."""
    powersgd_rank: int = 2
    """Rank of PowerSGD's low-rank approximation (with --comm-hook powersgd)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (CUDA when there is a GPU per process), cpu or cuda."""
    start_method: Literal["auto", "fork", "spawn"] = "auto"
    """How the workers start: auto (fork on CPU, spawn with CUDA), fork or spawn.

    Forked workers inherit the imported torch and torchvision instead of importing them again
    (seconds per launch); CUDA does not survive a fork. Steady-state throughput does not depend on it."""
    controls: bool = True
    """Measure the no-all-reduce control, torch's DDP defaults and (on CPU) the equal-threads process."""
    nnodes: int = 1
    """Nodes, one process each: run the same command on every node (with --node-rank, --master-addr)."""
    node_rank: int = 0
    """This node's rank (0..nnodes-1); node 0 runs the 1-process baseline and prints the report."""
    master_addr: str | None = None
    """Address of node 0 as the other nodes reach it (with --nnodes 2 or more)."""
    advise: bool = field(default=True, metadata={"flag": False})
    """Give the verdicts' advice (which hook to use); off for ``--smoke``, whose numbers mean nothing."""
    master_port: int = 29500
    """Port of the rendezvous store on node 0 (with --nnodes 2 or more)."""
    join_timeout: float = 120.0
    """Seconds a node waits for the others at each launch (node 0's baseline runs meanwhile)."""

    def __post_init__(self) -> None:
        from shoal.distributed.comm_hooks import check_comm_hook
        from shoal.workloads.archs import check_arch

        check_arch("synthetic", self.arch)  # the model it builds is synthetic's
        require_at_least(self, 1, "image_size", "batch_size", "steps", "repeat", "threads", "blocks")
        require_at_least(self, 0, "warmup")
        if any(n < 1 for n in self.world_sizes):
            raise ShoalError(
                f"world sizes must be at least 1, got {list(self.world_sizes)}", "pass --world-sizes 1,2 for example"
            )
        for hook in self.comm_hook:
            check_comm_hook(hook)
        require_at_least(self, 1, "powersgd_rank", "nnodes")
        if self.nnodes > 1:
            if set(self.world_sizes) - {1, self.nnodes}:
                raise ShoalError(
                    "--world-sizes does not go with --nnodes (one process per node)",
                    "drop --world-sizes: across nodes shoal measures 1 process and one per node",
                )
            if not self.master_addr or not 0 <= self.node_rank < self.nnodes:
                raise ShoalError(
                    f"--nnodes {self.nnodes} needs --master-addr and a --node-rank in 0..{self.nnodes - 1}",
                    "run the same command on every node with --node-rank 0, 1, ... and --master-addr NODE0",
                )
        check_start_method(self.start_method)


SMOKE = dict(world_sizes=(1, 2), image_size=16, batch_size=4, steps=2, warmup=1, repeat=1, blocks=1, advise=False)
"""Tiny sizes for ``--smoke``: checks the machinery in seconds; the numbers mean nothing."""


def plan_launches(cfg: ScalingConfig, world_sizes: list[int], on_cpu: bool) -> dict[int, tuple[Variant, ...]]:
    """The variants each world size's launch measures."""
    b, t = cfg.batch_size, cfg.threads
    launches: dict[int, tuple[Variant, ...]] = {}
    for n in world_sizes:
        variants = [Variant("ddp", t, b)]
        if n == 1:
            if on_cpu and cfg.controls and cfg.nnodes == 1:
                variants += [Variant(f"threads:{k * t}", k * t, k * b) for k in world_sizes if k > 1]
        else:
            variants += [Variant(f"hook:{h}", t, b, hook=h) for h in dict.fromkeys(cfg.comm_hook) if h != "none"]
            if cfg.controls:
                variants.append(Variant("no_allreduce", t, b, sync=False))
                if cfg.nnodes == 1:
                    variants.append(Variant("torch_defaults", t, b, torch_defaults=True))
        launches[n] = tuple(variants)
    return launches


def measure(cfg: ScalingConfig, log: Log) -> Measured:
    """Launch every world size ``repeat`` times, interleaved; rows, summaries and verdicts."""
    from shoal.distributed.device import choose_device

    cores = usable_cores()
    if cfg.nnodes > 1:
        world_sizes = [1, cfg.nnodes]
        device = choose_device(cfg.device, 0, 1)  # one process per node
    else:
        world_sizes = sorted(set(cfg.world_sizes or range(1, _default_max(cfg.device, cores) + 1)) | {1})
        device = choose_device(cfg.device, 0, max(world_sizes))  # cuda: a GPU per process, or an error
    on_cpu = device.type == "cpu"
    notes = []
    if on_cpu and cfg.nnodes == 1 and max(world_sizes) * cfg.threads > cores:
        notes.append(
            f"oversubscribed: up to {max(world_sizes) * cfg.threads} threads on {cores} cores; "
            "rows beyond the core count measure time-sharing, not scaling"
        )
    launches = plan_launches(cfg, world_sizes, on_cpu)
    start_method = resolve_start_method(cfg.start_method, device.type)
    if start_method == "fork":
        import torchvision.models  # noqa: F401  (imported once here, inherited by every worker)

        import shoal.distributed.comm_hooks  # noqa: F401
    runs: dict[tuple[int, str], list[float]] = {}
    loads = []  # sampled before each launch: how noisy it was
    model: dict[str, int] = {}
    for order in rotations(world_sizes, cfg.repeat):
        for n in order:
            if n == 1 and cfg.node_rank != 0:
                continue  # the baseline runs on node 0 alone
            loads.append(load_average())
            spec = WorkerSpec(
                cfg.arch, cfg.image_size, device.type, cfg.steps, cfg.warmup, cfg.blocks, launches[n], cfg.powersgd_rank
            )
            where = f" on {n} nodes" if n > 1 and cfg.nnodes > 1 else ""
            log(f"  launching {n} process(es){where}: {', '.join(v.name for v in launches[n])}")
            result = _launch(cfg, spec, n, start_method)
            if result is None:
                continue  # a node other than 0: rank 0 holds the timings
            model = result.pop("model")
            for name, timing in result.items():
                runs.setdefault((n, name), []).append(timing["samples_per_s"])
    resolved = {"world_sizes": world_sizes, "workload": "synthetic", "start_method": start_method}
    if cfg.node_rank != 0:
        note = f"node {cfg.node_rank} of {cfg.nnodes}: took part in every {cfg.nnodes}-node launch; node 0 reports"
        return Measured([], notes + [note], config=resolved, device=device.type, meta={"load_averages": loads})
    rows = _rows(cfg, launches, runs, on_cpu)
    summary = _summaries(rows, cfg, model)
    return Measured(
        rows,
        notes + [s["verdict"] for s in summary],
        config=resolved,
        device=device.type,
        meta={"load_averages": loads},
        extra={"summary": summary, "model": model},
    )


def _launch(cfg: ScalingConfig, spec: WorkerSpec, n: int, start_method: str) -> dict[str, Any] | None:
    """One launch of ``n`` processes: on this machine, or one per node across ``cfg.nnodes`` nodes
    (rank 0's timings on node 0, None on the others)."""
    if cfg.nnodes == 1 or n == 1:
        return launch_workers(scaling_worker, (spec,), n, start_method)
    from shoal.launch.local import launch_local
    from shoal.launch.options import LaunchOptions

    options = LaunchOptions(
        nproc=1,
        nnodes=str(cfg.nnodes),
        node_rank=cfg.node_rank,
        master_addr=cfg.master_addr,
        master_port=cfg.master_port,
        join_timeout=cfg.join_timeout,
        start_method=start_method,
    )
    return launch_local(scaling_worker, (spec,), options=options).get(0)


def _default_max(device: str, cores: int) -> int:
    if device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch.cuda.device_count()
    return cores


def _rows(cfg: ScalingConfig, launches, runs, on_cpu: bool) -> list[dict[str, Any]]:
    base = median(runs[(1, "ddp")])
    rows = []
    for n, variants in launches.items():
        for v in variants:
            values = runs[(n, v.name)]
            tput = median(values)
            scale = (n * v.threads / cfg.threads) if on_cpu else n
            rows.append(
                {
                    "world_size": n,
                    "variant": v.name,
                    "label": _label(n, v, on_cpu, cfg.nnodes > 1),
                    "processes": n,
                    "threads_per_process": v.threads if on_cpu else None,
                    "total_threads": n * v.threads if on_cpu else None,
                    "batch_per_process": v.batch_size,
                    "global_batch": v.batch_size * n,
                    "scale": scale,
                    "samples_per_s": tput,
                    "samples_per_s_runs": values,
                    "step_s": v.batch_size * n / tput,
                    "speedup": tput / base,
                    "efficiency": tput / (scale * base),
                    "time_reduction": 1.0 - base / tput,
                }
            )
    return rows


def _label(n: int, v: Variant, on_cpu: bool, nodes: bool = False) -> str:
    procs = f"{n} nodes x 1 proc" if nodes and n > 1 else f"{n} proc{'s' if n > 1 else ''}"
    threads = f" x {v.threads} thread{'s' if v.threads > 1 else ''}" if on_cpu else ""
    if v.name == "no_allreduce":
        return f"{procs}{threads}, no all-reduce"
    if v.name.startswith("hook:"):
        return f"{procs}{threads}, {v.hook} hook"
    if v.torch_defaults:
        return f"{procs}{threads}, torch's DDP defaults"
    if v.name.startswith("threads:"):
        return f"{procs}{threads}, batch {v.batch_size}"
    return f"{procs}{threads}"


def _summaries(rows: list[dict[str, Any]], cfg: ScalingConfig, model: dict[str, int]) -> list[dict[str, Any]]:
    """Per world size > 1: where the lost efficiency went, what each hook was worth, and a one-line verdict."""
    by = {(r["world_size"], r["variant"]): r for r in rows}

    def paired(a: dict[str, Any], b: dict[str, Any]) -> float:
        # Two variants measured in the same launch (or the same round) saw the same spell of a shared machine.
        return paired_ratio(a["samples_per_s_runs"], b["samples_per_s_runs"])

    out = []
    for (n, name), row in sorted(by.items()):
        if n == 1 or name != "ddp":
            continue
        s: dict[str, Any] = {"world_size": n, "efficiency": row["efficiency"]}
        control = by.get((n, "no_allreduce"))
        if control is not None:
            s["efficiency_no_allreduce"] = control["efficiency"]
            # The part of a step spent on gradient sync that did not overlap the backward pass.
            s["allreduce_share"] = 1.0 - paired(row, control)
        hooks = {h: by[(n, f"hook:{h}")] for h in cfg.comm_hook if (n, f"hook:{h}") in by}
        if hooks:
            s["hook_gains"] = {h: paired(r, row) - 1.0 for h, r in hooks.items()}
            s["efficiency_hooks"] = {h: r["efficiency"] for h, r in hooks.items()}
        defaults = by.get((n, "torch_defaults"))
        if defaults is not None:
            s["efficiency_torch_defaults"] = defaults["efficiency"]
            s["settings_gain"] = paired(row, defaults) - 1.0
        threads = by.get((1, f"threads:{n * cfg.threads}"))
        if threads is not None:
            s["processes_vs_threads"] = paired(row, threads)
        s["bound"], s["verdict"] = verdict(n, s, model, cfg.powersgd_rank, advise=cfg.advise)
        out.append(s)
    return out


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    rows = [
        [
            r["label"],
            r["global_batch"],
            rep.rate(r["samples_per_s"]),
            f"{r['step_s'] * 1000:.0f}",
            f"{r['speedup']:.2f}x",
            f"{r['efficiency']:.2f}",
            rep.less_time(r["time_reduction"]) + (" *" if r["variant"] != "ddp" else ""),
        ]
        for r in report["rows"]
    ]
    return [
        f"synthetic {cfg['arch']} {cfg['image_size']}x{cfg['image_size']}, batch {cfg['batch_size']}/process, "
        f"{cfg['steps']} timed steps ({cfg['blocks']} interleaved blocks) after {cfg['warmup']} warm-up, "
        f"median of {cfg['repeat']} launch(es)",
        "",
        rep.table(
            ["configuration", "global batch", "samples/s", "ms/step", "speedup", "efficiency", "fixed work vs 1 proc"],
            rows,
        ),
        "efficiency = samples/s / (scale x samples/s of 1 process); * = control/comparison, not the job",
    ]


def draw(ax: Any, report: dict[str, Any]) -> None:
    """Measured throughput against ideal linear scaling (and the controls)."""
    rows, cfg = report["rows"], report["config"]
    if not rows:  # a node other than 0 of a multi-node run: node 0 has the figures
        return
    base = next(r for r in rows if r["world_size"] == 1 and r["variant"] == "ddp")["samples_per_s"]

    def series(pred):
        pts = sorted((r["scale"], r["samples_per_s"]) for r in rows if pred(r))
        return [p[0] for p in pts], [p[1] for p in pts]

    def with_base(pred):
        return series(lambda r: pred(r) or (r["variant"] == "ddp" and r["world_size"] == 1))

    xs, ys = series(lambda r: r["variant"] == "ddp")
    ax.plot([1, max(xs)], [base, base * max(xs)], "k--", label="ideal linear")
    ax.plot(xs, ys, "o-", label="measured (DDP)")
    controls = (
        (lambda r: r["variant"] == "no_allreduce", "s:", "no all-reduce (control)"),
        *(((lambda r, h=h: r["variant"] == f"hook:{h}"), "^-", f"{h} hook") for h in cfg["comm_hook"]),
        (lambda r: r["variant"].startswith("threads:"), "d-.", "1 process, more threads"),
    )
    for pred, style, label in controls:
        cx, cy = with_base(pred)
        if len(cx) > 1:
            ax.plot(cx, cy, style, label=label)
    ax.set_xlabel("processes x threads (CPU) / processes (GPU)")
    ax.set_ylabel("global samples/s")
    ax.set_title(f"{cfg['arch']} {cfg['image_size']}x{cfg['image_size']}, batch {cfg['batch_size']}/process")
    ax.set_xticks(sorted({r["scale"] for r in rows}))
    ax.legend()


BENCHMARK = Benchmark(
    name="scaling",
    config=ScalingConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Train a torchvision ResNet (or an MLP) on random images with 1..N processes started by shoal's "
    "launcher; report global samples/s, speedup, scaling efficiency and the time saved on fixed work, with a "
    "no-all-reduce control and (CPU) 1 process with N x threads.",
    examples="""\
examples:
  shoal bench scaling                                   # 1..cores processes, ResNet-18 32x32
  shoal bench scaling --world-sizes 1,2 --repeat 5      # more repeats on a noisy machine
  shoal bench scaling --comm-hook bf16,powersgd         # also measure gradient compression
  shoal bench scaling --nnodes 2 --node-rank 0 --master-addr 10.0.0.1  # node 1: --node-rank 1
  shoal bench scaling --arch resnet50 --image-size 64 --batch-size 16
  shoal bench scaling --device cuda --world-sizes 1,2,4,8 --json scaling.json   # GPUs, nccl
  shoal bench scaling --smoke --json /tmp/s.json        # a few seconds: checks the machinery only
""",
)
