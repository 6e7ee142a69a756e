"""Resource checks: GPUs against the processes asked for, CUDA_VISIBLE_DEVICES, /dev/shm, open files,
the checkpoint directory."""

from __future__ import annotations

import os
import resource
import tempfile

from shoal.doctor.model import Check, fail, ok, warn
from shoal.doctor.settings import NCCL_SHM_PER_PEER, SHM_PER_LOADER_WORKER, DoctorSettings
from shoal.doctor.software import gpu_hardware

SHM = "/dev/shm"
NOFILE_MIN = 1024
"""Below this, a few DataLoader workers sharing tensors through file descriptors run out."""
NOFILE_GOOD = 4096


def size(nbytes: float) -> str:
    """``1.5 GiB``, ``64 MiB``, ``12 KiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(nbytes) >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{int(nbytes)} B"


def gpu_check(nproc: int) -> Check:
    """GPUs visible here against the processes asked for on this node (one per GPU)."""
    import torch

    if not torch.cuda.is_available():
        return ok("gpus", f"no GPU visible: {nproc} process(es) on the CPU (gloo)", gpus=0, nproc=nproc)
    count = torch.cuda.device_count()
    if nproc > count:
        return fail(
            "gpus",
            f"{nproc} processes asked for on this node, but only {count} GPU(s) are visible",
            f"run {count} process(es) per node (--nproc {count}: one per GPU), or make more GPUs visible "
            "(CUDA_VISIBLE_DEVICES, the scheduler's GPU request: --gpus-per-node, nvidia.com/gpu)",
            gpus=count,
            nproc=nproc,
        )
    if nproc < count:
        return warn(
            "gpus",
            f"{count} GPUs visible, {nproc} process(es) asked for: {count - nproc} GPU(s) stay idle",
            f"pass --nproc {count} to use them all (or hide the others with CUDA_VISIBLE_DEVICES)",
            gpus=count,
            nproc=nproc,
        )
    return ok("gpus", f"{count} GPU(s), one per process", gpus=count, nproc=nproc)


def cores_check(nproc: int) -> Check:
    """The processes asked for on this node against its usable cores (more is slower, not faster)."""
    from shoal.env.host import usable_cores
    from shoal.launch.options import oversubscribed

    cores = usable_cores()
    too_many = oversubscribed(nproc, cores)
    if too_many:
        return warn("cores", *too_many, cores=cores, nproc=nproc)
    return ok("cores", f"{cores} usable core(s) for {nproc} process(es)", cores=cores, nproc=nproc)


def visible_devices_check() -> Check:
    """CUDA_VISIBLE_DEVICES: unset, empty (hides every GPU), duplicated or invalid entries."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    name = "cuda-visible-devices"
    if raw is None:
        return ok(name, "unset: every GPU of this node is visible", value=None)
    entries = [e.strip() for e in raw.split(",")] if raw.strip() else []
    if not entries:
        if gpu_hardware():
            return warn(
                name,
                "CUDA_VISIBLE_DEVICES is empty: it hides every GPU of this node",
                "unset it, or list the GPUs for this job (e.g. 0,1)",
                value=raw,
            )
        return ok(name, "empty (this node has no GPU anyway)", value=raw)
    duplicates = sorted({e for e in entries if entries.count(e) > 1})
    if duplicates:
        return fail(
            name,
            f"CUDA_VISIBLE_DEVICES={raw} lists {', '.join(duplicates)} more than once",
            "list each GPU once (CUDA then sees none of them)",
            value=raw,
        )
    invalid = [e for e in entries if not (e.isdigit() or e.startswith(("GPU-", "MIG-")))]
    if invalid:
        return warn(
            name,
            f"CUDA_VISIBLE_DEVICES={raw}: {invalid[0]!r} is not a GPU index or UUID; CUDA ignores it and all after it",
            "list GPU indices (0,1) or UUIDs from `nvidia-smi -L`",
            value=raw,
        )
    return ok(name, f"CUDA_VISIBLE_DEVICES={raw} ({len(entries)} GPU(s))", value=raw)


def shm_check(nproc: int, loader_workers: int, gpus: int = 0) -> Check:
    """/dev/shm against what the DataLoader workers (and NCCL between local GPUs) put there."""
    try:
        st = os.statvfs(SHM)
    except OSError as err:
        return fail(
            "shm",
            f"{SHM} is missing ({err.strerror}): DataLoader workers and NCCL cannot share memory",
            "mount a tmpfs at /dev/shm (Kubernetes: an emptyDir with medium: Memory)",
        )
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    need = nproc * loader_workers * SHM_PER_LOADER_WORKER
    if gpus > 1 and nproc > 1:
        need += nproc * (nproc - 1) * NCCL_SHM_PER_PEER
    data = {"bytes": total, "free": free, "need": need, "nproc": nproc, "loader_workers": loader_workers}
    what = f"{nproc} process(es) x {loader_workers} DataLoader worker(s) need about {size(need)}"
    fix = (
        "give the container more (docker run --shm-size=8g; Kubernetes: an emptyDir with medium: Memory "
        "mounted at /dev/shm), or use fewer DataLoader workers (--loader-workers says how many you plan)"
    )
    if total < need:
        return fail("shm", f"{SHM} is {size(total)} ({size(free)} free); {what}", fix, **data)
    if free < need:
        return warn(
            "shm",
            f"{SHM} is {size(total)} but only {size(free)} is free; {what}",
            "remove what fills it (leftover torch_* or nccl-* segments of killed jobs), or " + fix,
            **data,
        )
    return ok("shm", f"{SHM}: {size(total)} ({size(free)} free); {what}", **data)


def nofile_check() -> Check:
    """The open-files limit (every gloo/NCCL peer, DataLoader worker and shared tensor takes descriptors)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    data = {"soft": soft, "hard": hard}
    shown = f"open files limit {soft} (hard {'unlimited' if hard == resource.RLIM_INFINITY else hard})"
    target = NOFILE_GOOD * 16 if hard == resource.RLIM_INFINITY else min(hard, NOFILE_GOOD * 16)
    raise_it = (
        f"raise it before starting the job: `ulimit -n {max(target, NOFILE_GOOD)}` (Slurm: --propagate=NOFILE; "
        "docker: --ulimit nofile=65536; systemd: LimitNOFILE=)"
    )
    if soft < NOFILE_MIN:
        return fail("nofile", f"{shown}: DataLoader workers and peers will run out of descriptors", raise_it, **data)
    if soft < NOFILE_GOOD:
        return warn("nofile", f"{shown}: tight for many DataLoader workers or ranks", raise_it, **data)
    return ok("nofile", shown, **data)


def checkpoint_dir_check(settings: DoctorSettings) -> Check:
    """The checkpoint directory (or the nearest existing parent, where it will be made): a real write, free space."""
    path = os.path.abspath(settings.checkpoint_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        return fail(
            "checkpoint-dir",
            f"{path} is a file, not a directory",
            "give --checkpoint-dir a directory",
            path=path,
        )
    target = nearest_existing(path)
    made = "" if target == path else f" (to be made in {target})"
    try:
        fd, probe = tempfile.mkstemp(prefix=".shoal-doctor-", dir=target)
        try:
            os.write(fd, b"shoal doctor\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        return fail(
            "checkpoint-dir",
            f"cannot write in {target}{' for ' + path if made else ''}: {err.strerror}",
            "give --checkpoint-dir a directory this user can write (check permissions, and that the volume is "
            "not mounted read-only)",
            path=path,
        )
    st = os.statvfs(target)
    free = st.f_bavail * st.f_frsize
    data = {"path": path, "free": free, "need": settings.min_free_bytes}
    if free < settings.min_free_bytes:
        return fail(
            "checkpoint-dir",
            f"{path}{made}: only {size(free)} free, less than {settings.min_free_gb:g} GiB",
            "free some space, or give --checkpoint-dir a larger volume (a checkpoint holds the model, the "
            "optimizer state and the RNG states: 2-3x the model's size)",
            **data,
        )
    return ok("checkpoint-dir", f"{path}{made}: writable, {size(free)} free", **data)


def nearest_existing(path: str) -> str:
    """``path`` if it exists, else its deepest existing ancestor."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
