"""The limits and mode of a :class:`wmrl_research.sandbox.Sandbox` and the result of one job (plain
data). (Moved out of wmrl_research/sandbox.py unchanged; its names are importable from there too.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wmrl_research.sandbox_host import MAX_SLOTS

STATUSES = ("ok", "error", "timeout", "invalid", "killed")
DEFAULT_PRELOAD = (
    "numpy",
    "scipy",
    "scipy.signal",
    "pandas",
    "sklearn",
    "sklearn.linear_model",
    "sklearn.ensemble",
    "sklearn.preprocessing",
    "sklearn.pipeline",
    "sklearn.metrics",
    "sklearn.neighbors",
    "sklearn.svm",
    "sklearn.tree",
    "sklearn.impute",
    "sklearn.decomposition",
    "sklearn.model_selection",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.optim",
    "torch._dynamo",  # imported lazily by the first optimizer step: seconds per job if not here
)
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}


@dataclass
class SandboxConfig:
    """Limits and mode of a :class:`Sandbox`. Budgets of the *task* are in steps/epochs; these are
    safety limits, generous enough that a sane solution never meets them."""

    # Keep pre-imported workers and fork per job (fast); False: a fresh interpreter per job.
    warm: bool = True
    # Maximum number of concurrent jobs (one worker each).
    max_workers: int = 1
    # Memory a job may add (heap, MiB; also the cgroup limit on top of the worker's own memory).
    mem_mb: int = 2048
    # Size of the job's tmpfs working folder and the largest file it may write (MiB).
    disk_mb: int = 64
    # CPU seconds per job; None: 2 x the wall-clock timeout + 1.
    cpu_s: float | None = None
    # Processes/threads a job may run at once (RLIMIT_NPROC for its uid and the pids cgroup).
    nproc: int = 64
    # Modules a warm worker imports before forking jobs.
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    # Use cgroup v1 memory/pids (and cpuacct) controllers when writable ("auto"), always ("on"),
    # never ("off").
    cgroups: str = "auto"

    def __post_init__(self) -> None:
        if not 1 <= self.max_workers <= MAX_SLOTS:
            raise ValueError(f"SandboxConfig.max_workers must be in [1, {MAX_SLOTS}], got {self.max_workers}")
        if self.cgroups not in ("auto", "on", "off"):
            raise ValueError(f"SandboxConfig.cgroups must be auto|on|off, got {self.cgroups!r}")
        for name in ("mem_mb", "disk_mb", "nproc"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class SandboxResult:
    """The outcome of one execution.

    ``status``: ``ok`` (exit 0 and a predictions file), ``error`` (non-zero exit: an exception),
    ``timeout`` (killed at the wall-clock limit), ``invalid`` (exit 0 but no usable predictions
    file), ``killed`` (died from a signal: out of memory, CPU limit, killed itself; an OOM kill that
    none of its own limits explains runs the job again, then raises ``SandboxError``: module doc).
    """

    status: str
    stdout: str  # the last TAIL_CHARS characters
    stderr: str
    seconds: float  # the solution's own wall-clock time, from start to exit or kill
    predictions_path: Path | None  # kept until KEEP_JOB_DIRS later jobs, or the sandbox closes
    exit_code: int | None = None
    message: str = ""
    cpu_s: float = 0.0  # CPU time of the job's processes, measured outside it (module doc: Accounting)
    maxrss_mb: float = 0.0  # its peak memory, measured likewise (MiB)
    overhead_s: float = 0.0  # host-side wall time beyond the job's own (fork, IO, messaging)
