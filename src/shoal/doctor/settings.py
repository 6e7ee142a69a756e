"""What ``shoal doctor`` checks against: :class:`DoctorSettings` (its flags come from these fields)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shoal.env.base import DEFAULT_MAIN_PORT
from shoal.errors import ShoalError
from shoal.launch.options import parse_endpoint

SHM_PER_LOADER_WORKER = 128 << 20
"""/dev/shm one DataLoader worker process may fill: its 2 prefetched batches (``prefetch_factor``) of
about 64 MB each (64 images of 3x224x224 in float32 are 38.5 MB)."""
NCCL_SHM_PER_PEER = 10 << 20
"""/dev/shm NCCL's shared-memory transport takes per pair of local GPUs (its segments are ~9.2 MB)."""


@dataclass(frozen=True, kw_only=True)
class DoctorSettings:
    """The job the checks are made for. Defaults: one process, checkpoints under ./runs."""

    master: str | None = field(default=None, metadata={"metavar": "ADDR[:PORT]"})
    """The master node (node rank 0, where the rendezvous listens), port 29500 unless given: checks the
    route to it, its name and its port (free on the master, reachable elsewhere). One node only."""
    checkpoint_dir: str = field(default="runs", metadata={"metavar": "DIR"})
    """Where the job writes checkpoints: it must be writable and have free space; across nodes,
    rank 0 writes a token there that every node must read back (shared storage)."""
    loader_workers: int = 2
    """DataLoader worker processes per training process (the /dev/shm check)."""
    min_free_gb: float = field(default=1.0, metadata={"metavar": "GB"})
    """Free space the checkpoint directory must have, in GB (2**30 bytes)."""
    probe_timeout: float = field(default=10.0, metadata={"metavar": "S"})
    """Across nodes: seconds one probe (a message, an all-reduce) may take before its peer counts as lost."""
    lighthouse: str | None = field(default=None, metadata={"metavar": "URL"})
    """A fault-tolerant job's torchft lighthouse (http://HOST:PORT; default $TORCHFT_LIGHTHOUSE): it must
    answer a TCP connection within 3 s."""
    fault_tolerance: bool = False
    """The job runs with --fault-tolerance: with --master, the lighthouse's port (the master's port) must be
    free on the master and answer elsewhere; on one node, a free port on 127.0.0.1."""
    probe_mb: float = field(default=16.0, metadata={"metavar": "MB"})
    """Across nodes: the largest message of the point-to-point bandwidth probes, in MB (2**20 bytes)."""

    def __post_init__(self) -> None:
        if self.loader_workers < 0:
            raise ShoalError(f"--loader-workers must be 0 or more, got {self.loader_workers}", "pass e.g. 4")
        if self.min_free_gb < 0:
            raise ShoalError(f"--min-free-gb must be 0 or more, got {self.min_free_gb:g}", "pass e.g. 10")
        if not self.probe_timeout > 0:
            raise ShoalError(f"--probe-timeout must be positive, got {self.probe_timeout:g}", "pass e.g. 10")
        if not 0.0625 <= self.probe_mb <= 1024:
            raise ShoalError(f"--probe-mb must be between 1/16 and 1024, got {self.probe_mb:g}", "pass e.g. 16")
        if self.master is not None:
            self.master_endpoint  # noqa: B018  (parses, or raises ShoalError naming the flag's value)
        if self.lighthouse is not None:
            from shoal.doctor.lighthouse import parse_lighthouse

            parse_lighthouse(self.lighthouse)

    @property
    def master_endpoint(self) -> tuple[str, int] | None:
        """(host, port) of ``--master``, or None."""
        if self.master is None:
            return None
        return parse_endpoint(self.master, DEFAULT_MAIN_PORT)

    @property
    def min_free_bytes(self) -> int:
        return int(self.min_free_gb * (1 << 30))
