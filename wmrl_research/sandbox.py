"""Run untrusted solution code in a bubblewrap sandbox with a warm, pre-imported worker.

What is isolated (each point has an adversarial test in ``tests/research/test_sandbox.py``):

- **Network**: none, and a network namespace per job (only a loopback device inside; no socket
  state such as TIME_WAIT passes from one job to the next). No unix sockets either: a seccomp
  filter refuses ``socket(AF_UNIX, ...)`` and every ``socketpair`` but a ``SOCK_STREAM`` one (a
  datagram or seqpacket pair, once disconnected, could ``sendto`` a socket on any path), so no
  pathname socket on a mounted folder and no abstract socket of the host is reachable;
  ``multiprocessing``'s stream pairs still work.
- **Filesystem**: the sandbox sees only ``/usr``, ``/etc``, the base Python installation, the
  virtual environment's ``lib`` and ``pyvenv.cfg`` (mounted at ``/opt/venv``, not at their host
  path), the worker script, all read-only, plus its own task's public data (read-only, at
  ``$WMRL_DATA_DIR``; no other task's folder) and a fresh tmpfs per job (size-limited: the disk
  limit), which is its working folder and its ``/dev/shm``. Never the project tree, run directories, ``.git``, the host's
  temporary folder or the folder a run was launched from. Every data file of every package a
  task imports (derived from the task folders' code: :func:`task_data_packages`,
  :func:`package_data_files`) and the copies in :data:`BUNDLED_DATA` are covered by empty mounts,
  so test rows cannot be matched against a labelled copy. The hidden test labels live in a folder
  that is never mounted; a data root under a mounted folder (``/usr``, ``/etc``, the Python
  installation) is refused. Nothing a job writes survives it except ``predictions.npy`` and its stdout/stderr.
- **The split**: which rows are test rows is drawn from a secret per data build, stored next to the
  hidden labels (``tasks/base.py``), so not derivable inside even from the task's code and seed.
  A task that declares a fixed split (``TaskSpec.fixed_split``: a time split, or a user's own split;
  ``tasks/README.md``) gives this up: its test rows follow from its code, though their labels are
  still never mounted.
- **Other jobs**: each job has its own mount, PID and IPC namespace; it cannot see other jobs'
  folders, processes (its ``/proc`` shows only its own) or IPC objects: System V shared memory,
  message queues and semaphores, POSIX message queues (``/dev/mqueue``, a fresh ``mqueue`` file
  system per job) and POSIX shared memory and semaphores (``/dev/shm``, part of its tmpfs, so
  ``multiprocessing`` works). Once the job is gone its supervisor removes every IPC object it left
  and unmounts its tmpfs before reporting, so that memory (charged to the worker's cgroup) is free
  before the next job starts: an honest job after one that leaks runs as on a fresh worker.
- **Privileges**: the job runs as an unprivileged uid (:func:`job_uid`: one per host process and
  worker slot, so concurrent jobs never share a process limit) with no capabilities,
  ``no_new_privs`` and a seccomp filter (no ``keyctl``/``add_key``/``request_key``, no io_uring,
  no ``AF_UNIX`` sockets, no user namespaces: see *Kernel surface*) and a read-only ``/proc``; it
  cannot signal the worker or the host. The worker replaces the session
  keyring it inherits from the host by a new empty one, so no job possesses the host's keys.
- **Process lifetime**: the job is PID 1 of its namespace, so when it ends, or is killed at the
  wall-clock timeout, the kernel kills every process it started; when it left any, the supervisor
  waits until all are gone before it reports, so the next job under the same uid starts with its
  full process limit (a fork bomb does not break its neighbour). Workers die with the host process
  (``--die-with-parent``).
- **Status reports**: the job reports its exit code on a pipe, exactly ``{"code": n}``; a report
  that is malformed (not JSON, an exit code that is not a small int, a missing or extra field) or
  longer than
  ``worker.MAX_STATUS_BYTES`` is graded as a failed run and ends the job (so flooding the pipe
  costs the supervisor at most one bounded read). A source that is not valid UTF-8 text (a lone
  surrogate) is graded as an error without running. Neither raises :class:`SandboxError`.
- **Accounting**: ``SandboxResult.cpu_s`` and ``maxrss_mb`` are measured outside the job, never
  taken from it, and hold the job's own work only: the job's setup (measured by its trusted code
  before the solution runs) is subtracted and, with cgroups, its CPU time is read when it reports,
  before the kernel tears down the large process it was forked as (without cgroups ``wait4`` still
  counts that teardown). Where the host gives the worker cgroup v1 ``cpuacct`` and
  ``memory`` groups, from groups of the job's own: the CPU time of all its processes however they
  ended, and the peak of the memory charged to them (heap, tmpfs, shared memory; not the warm
  worker's pages they share). Otherwise from ``wait4``: the job and every process reaped by it or
  by its namespace's teardown, the peak being the largest resident set of one process (the warm
  worker's shared pages included); a child reaped by the kernel because its parent ignores
  SIGCHLD is missing from those. The read-only ``/proc`` keeps a job from resetting its peak
  (``/proc/self/clear_refs``).
- **Resources**: rlimits on CPU time, file size (disk), open files, number of processes, heap
  (``RLIMIT_DATA``) and address space (``RLIMIT_AS``), the last two relative to what the worker
  has already mapped (an absolute ``RLIMIT_AS`` would stop torch from importing), so without
  cgroups a job can still use about ``mem_mb`` + 4 GiB of shared anonymous memory before its
  mappings fail. Where cgroup v1 memory/pids controllers are writable (detected by
  :func:`cgroup_support`; used automatically, ``SandboxConfig.cgroups``), each worker also gets a
  memory cgroup (``mem_mb`` + ``disk_mb`` + the worker's own 1.5 GiB: one cap on the sum over all
  of a job's processes, which are OOM-killed, not the worker) and a pids cgroup (fork cap), and a
  ``cpuacct`` cgroup where that controller is writable too (accounting).
  Without them it falls back to the rlimits alone.

What is *not* isolated: the host's page cache (a job can leave bits for a later job by reading
files the host has not cached, read back by timing: measured in docs/sandbox.md); the job can read ``/usr``, ``/etc``, the Python environment (minus the
bundled datasets above) and ``/proc/self/mountinfo``, which names the host folders mounted in (names
only, not their other contents); it shares the kernel (the seccomp filter is a short deny list, not
an allow list: a kernel exploit is out of scope) and the CPUs with the host (a solution can slow
other jobs down, within its CPU limit); each job has its own memory group capped at ``mem_mb`` + ``disk_mb`` (heap, tmpfs, shared
memory of all its processes), below the worker's, so its OOM kills stay inside it (never the worker
or the next job, pre-forked in a group of its own; that one gets its ``oom_score_adj`` of 1000
only when its request arrives); a supervisor or worker lost anyway is retried once on a fresh
worker (``SUPERVISOR_TRIES``), not graded, and the lost worker's cgroups are removed; only cgroup v1 controllers are
detected (on a v2-only host the rlimits alone apply, so several processes each get ``mem_mb``);
a job forked from a warm worker inherits the worker's already-imported modules (copy-on-write: it
cannot change the worker's copy), with global state such as RNGs identical for every job. Generated
data is seeded with the build's secret (``tasks.base.generator_seed``), so it cannot be
regenerated; forecasting tasks split by time, not by the secret, with test windows that do not
overlap (a later one still starts right after an earlier one's targets). The sandbox needs root on the host (it
creates namespaces, mounts and uid switches through ``bwrap --cap-add``; the job itself never holds
a capability). Without bubblewrap (``bwrap`` not on PATH) :class:`Sandbox` refuses to start rather
than run unsandboxed.

Kernel surface: a job shares the host's kernel and may make every syscall the filter does not
refuse. It cannot create a namespace: every kind but a user namespace needs a capability it lacks,
and user namespaces, which the kernel lets any user create unless the host limits them
(``user.max_user_namespaces``), are refused by the filter (``unshare``/``clone`` with
``CLONE_NEWUSER``: EPERM; ``clone3``, whose flags a filter cannot read: ENOSYS, after which the C
library falls back to ``clone``). In a user namespace of its own a job would hold every capability
over that namespace's objects; the mounts it inherits stay locked (it could not uncover a hidden
folder) and it would gain nothing outside, but it would reach the kernel code that asks for
``CAP_NET_ADMIN``/``CAP_SYS_ADMIN`` (netfilter, new network and mount namespaces), where many
local privilege escalations were found, and no solution needs it: so it is closed. Open: the rest of
the syscall table (a deny list), among them ``ptrace`` of the job's own processes and whatever the
host's sysctls leave to unprivileged users (``perf_event_open``: ``kernel.perf_event_paranoid``;
``bpf``: ``kernel.unprivileged_bpf_disabled``; ``userfaultfd``: ``vm.unprivileged_userfaultfd``),
its own read-only ``/proc`` and ``/dev/pts``.

Two modes: ``warm=True`` (default) keeps pre-imported workers and forks per job (tens of ms of
overhead); ``warm=False`` starts a fresh sandboxed interpreter per job (strongest separation, pays
the imports each time).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import wmrl_research
from wmrl_research.tasks.base import DATA_ENV, PREDICTIONS_FILE, data_root

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
TAIL_CHARS = 4000
# cgroup memory for the worker process itself (its pre-imported libraries), on top of the job's.
WORKER_MEMORY_MB = 1536
KEEP_JOB_DIRS = 32
SUPERVISOR_TRIES = 2  # a job whose supervisor or worker was lost runs again once, on a fresh worker
_WORKER_IDS = itertools.count()  # process-wide: names each worker's cgroups uniquely


# Where the sandbox sees the virtual environment and the worker script (not at their host paths,
# which lie inside the project's folder).
VENV_DIR = Path("/opt/venv")
WORKER_DIR = Path("/opt/wmrl")
CGROUP_DIR = "/tmp/cgroup"  # the worker's memory/cpuacct cgroups, inside (worker.CGROUP_DIR)
# Besides the data files of every package a task draws from (derived: :func:`task_data_packages`,
# :func:`package_data_files`), these bundled copies of datasets (and test folders, which hold more
# copies: iris in scipy's and statsmodels' tests), relative to a site-packages folder, are covered
# by empty mounts too: packages no built-in task imports, whose data a user's task might draw on.
BUNDLED_DATA = (
    "sklearn/datasets/data",
    "sklearn/datasets/descr",
    "sklearn/datasets/images",
    "sklearn/datasets/tests",
    "statsmodels/datasets/*/*.csv",
    "statsmodels/datasets/*/*.s",
    "statsmodels/datasets/*/src",
    "statsmodels/**/tests",
    "scipy/**/tests",
    "vega_datasets/_data",
    "palmerpenguins/data",
    "pydataset/resources",
    "sktime/datasets/data",
    "seaborn/data",
)
# What a file of a package counts as code (never masked); every other file in a folder without code
# is data, and so is, next to code, a file in one of DATA_SUFFIXES (after a compression suffix).
CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".pxd", ".pxi", ".pyx", ".so", ".pyd", ".h", ".hpp", ".c", ".cpp")
DATA_SUFFIXES = frozenset(
    ".csv .tsv .txt .dat .data .dta .sav .xpt .sas7bdat .por .arff .npz .npy .mat .h5 .hdf5 .nc"
    " .parquet .feather .xls .xlsx .ods .json .rda .rdata .rds .pkl .pickle .joblib .svmlight .libsvm"
    " .s .asc .rst .jpg .jpeg .png .gif .bmp .pgm .tif .tiff .wav .zip .tar".split()
)
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lzma")
# Data files a package reads at run time that hold no dataset (masking them would break it).
RUNTIME_DATA = (
    "scipy/stats/_sobol_direction_numbers.npz",  # scipy.stats.qmc.Sobol's table
    *(
        f"vega_datasets/{n}.json" for n in ("datasets", "dataset_info", "local_datasets")
    ),  # names, read on import
)

UID_BASE = 200_000
MAX_SLOTS = 64


def job_uid(slot: int, pid: int | None = None) -> int:
    """The unprivileged uid of jobs run by worker ``slot`` of host process ``pid`` (default: this one).

    Distinct per host process and slot: ``RLIMIT_NPROC`` counts processes per uid, so jobs that ran
    under a shared uid could exhaust each other's process limit.
    """
    if not 0 <= slot < MAX_SLOTS:
        raise ValueError(f"worker slot must be in [0, {MAX_SLOTS}), got {slot}")
    return UID_BASE + (((os.getpid() if pid is None else pid) % 65536) * MAX_SLOTS) + slot


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the solution): the job is ungraded."""


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
    file), ``killed`` (died from a signal: out of memory, CPU limit, killed itself).
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


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@cache
def cgroup_support() -> dict[str, Path | None]:
    """Parent folders under which this process may create memory/pids/cpuacct cgroups (v1), or None
    each.

    Detected by creating and removing a probe group; a read-only or v2-only system yields Nones.
    """
    out: dict[str, Path | None] = {"memory": None, "pids": None, "cpuacct": None}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for ctl in controllers.split(","):
            if ctl in out:
                parent = Path("/sys/fs/cgroup") / ctl / path.lstrip("/")
                probe = parent / f"wmrl-probe-{os.getpid()}"
                try:
                    probe.mkdir()
                    probe.rmdir()
                    out[ctl] = parent
                except OSError:
                    pass
    return out


class _Worker:
    """One bwrap process running :mod:`wmrl_research.worker` (pre-imported when warm)."""

    def __init__(self, sandbox: Sandbox, slot: int) -> None:
        self.slot = slot
        self.uid = job_uid(slot)
        self.cgroups: list[Path] = []
        cfg = sandbox.config
        name = f"wmrl-sbx-{os.getpid()}-{slot}-{next(_WORKER_IDS)}"
        cg = cgroup_support() if cfg.cgroups != "off" else {}
        if cfg.cgroups == "on" and not (cg.get("memory") and cg.get("pids")):
            raise SandboxError(f"SandboxConfig.cgroups='on' but cgroup v1 controllers are not writable: {cg}")
        mem_parent, pids_parent, cpu_parent = cg.get("memory"), cg.get("pids"), cg.get("cpuacct")
        accounting: dict[str, Path] = {}  # bound into the sandbox: the supervisor makes one group per job
        if mem_parent is not None:
            group = mem_parent / name
            group.mkdir()
            limit = (cfg.mem_mb + cfg.disk_mb + (WORKER_MEMORY_MB if cfg.warm else 0)) * 2**20
            (group / "memory.limit_in_bytes").write_text(str(limit))
            self.cgroups.append(group)
            accounting["memory"] = group
        if pids_parent is not None:
            group = pids_parent / name
            group.mkdir()
            (group / "pids.max").write_text(str(cfg.nproc + 16))
            self.cgroups.append(group)
        if cpu_parent is not None:
            group = cpu_parent / name
            group.mkdir()
            self.cgroups.append(group)
            accounting["cpuacct"] = group
        config = {
            "preload": list(cfg.preload) if cfg.warm else [],
            "uid": self.uid,
            "disk_mb": cfg.disk_mb,
            "cgroups": sorted(accounting),
            # each job's own memory group is capped at the job's share: its OOM kills stay inside it
            "job_memory": (cfg.mem_mb + cfg.disk_mb) * 2**20,
        }
        binds = [
            a for ctl, group in accounting.items() for a in ("--bind", str(group), f"{CGROUP_DIR}/{ctl}")
        ]
        argv = (
            sandbox._bwrap_argv()
            + binds
            + [sandbox._python(), str(WORKER_DIR / "worker.py"), json.dumps(config)]
        )
        if self.cgroups:
            enter = "; ".join(f"echo $$ > {g / 'cgroup.procs'}" for g in self.cgroups)
            argv = ["/bin/sh", "-c", f'{enter}; exec "$@"', "sh", *argv]
        self.log = open(sandbox.jobs_root / f"worker-{slot}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=sandbox._worker_env(),
            start_new_session=True,
            cwd="/",
        )
        self._buf = b""
        hello = self.read_reply(timeout=180.0)
        if hello is None or not hello.get("ready"):
            self.close()
            raise SandboxError(f"sandbox worker did not start; see {self.log.name}")
        self.preload_s = float(hello.get("preload_s", 0.0))
        self.preload_failed = list(hello.get("preload_failed", []))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, req: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()

    def read_reply(self, timeout: float) -> dict | None:
        """The next JSON line from the worker, or None on timeout or if it died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for group in self.cgroups:  # anything that escaped the process group is still in the cgroup
            for member in _cgroup_tree(group):  # a job's own group included
                try:
                    for pid in (member / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for group in self.cgroups:
            for member in reversed(_cgroup_tree(group)):
                for _ in range(50):
                    try:
                        member.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)
        self.cgroups = []
        self.log.close()


@dataclass
class Sandbox:
    """A pool of sandboxed workers; :meth:`run` executes one solution. Thread-safe."""

    config: SandboxConfig = field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        if bwrap_path() is None:
            raise SandboxError("bubblewrap (`bwrap`) is not installed: `apt-get install -y bubblewrap`")
        if os.geteuid() != 0:
            # The per-job namespaces, tmpfs mounts and uid switch need real root outside the
            # sandbox (bwrap --cap-add); an unprivileged user-namespace variant is not implemented.
            raise SandboxError("the sandbox must run as root (it drops every job to an unprivileged uid)")
        self._pid = os.getpid()
        _refuse_a_mounted_data_root(data_root())
        self.data_root = data_root() / "public"
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.hidden_root = data_root() / "hidden"
        _remove_stale()
        self.jobs_root = Path(tempfile.mkdtemp(prefix=f"wmrl-sbx-{os.getpid()}-"))
        os.chmod(self.jobs_root, 0o755)
        self._ids = itertools.count()
        self._idle: list[_Worker] = []
        self._slots = list(range(self.config.max_workers))
        self._cond = threading.Condition()
        self._done: deque[Path] = deque()
        self._closed = False
        atexit.register(self.close)

    # --- public ---------------------------------------------------------------------------------
    def run(self, source: str, data_dir: Path, timeout_s: float = 60.0) -> SandboxResult:
        """Execute ``source`` as ``solution.py`` with ``$WMRL_DATA_DIR`` = ``data_dir`` (read-only).

        ``data_dir`` must lie under the public data root (:func:`data_root` / ``public``).
        Returns the result; raises :class:`SandboxError` only if the sandbox itself failed.
        """
        if not isinstance(source, str):
            raise TypeError(f"source must be str, got {type(source).__name__}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        data_dir = Path(data_dir).resolve()
        try:
            rel = data_dir.relative_to(self.data_root.resolve())
        except ValueError:
            raise ValueError(
                f"data_dir {data_dir} is not under the sandbox's data root {self.data_root}"
            ) from None
        if rel == Path("."):
            raise ValueError(
                f"data_dir must be one task's folder under {self.data_root}, got the root itself"
            )
        try:
            encoded = source.encode("utf-8")
        except UnicodeEncodeError as e:  # e.g. a lone surrogate: the solution's fault, graded as such
            return SandboxResult(
                status="error",
                stdout="",
                stderr="",
                seconds=0.0,
                predictions_path=None,
                message=f"solution source is not valid UTF-8 text ({e.reason} at character {e.start})",
            )
        t0 = time.monotonic()
        job = f"job{next(self._ids):06d}"
        job_dir = self.jobs_root / job
        job_dir.mkdir(mode=0o755)
        (job_dir / "solution.py").write_bytes(encoded)
        cfg = self.config
        cpu_s = cfg.cpu_s if cfg.cpu_s is not None else 2 * timeout_s + 1
        req = {
            "job": job,
            "timeout_s": timeout_s,
            "cpu_s": max(1, int(cpu_s + 0.999)),
            "mem_mb": cfg.mem_mb,
            "disk_mb": cfg.disk_mb,
            "nproc": cfg.nproc,
            "data": rel.as_posix(),
            "env": self._job_env("/tmp/data"),
        }
        # A supervisor (or worker) lost to the host is not the solution's failure: the job runs again
        # on a fresh worker (the lost one is closed, its cgroups removed), at most SUPERVISOR_TRIES times.
        for _ in range(SUPERVISOR_TRIES):
            worker = self._acquire()
            healthy = False
            try:
                worker.send(req)
                reply = worker.read_reply(timeout=timeout_s + 30.0)
                healthy = (
                    reply is not None
                    and reply.get("job") == job
                    and reply.get("supervisor_exit") == 0
                    and worker.alive()
                )
            except (BrokenPipeError, OSError, json.JSONDecodeError):
                reply = None
            finally:
                self._release(worker, healthy)
            if healthy:
                break
            if reply is None:
                lost = f"sandbox worker failed during {job}; see {worker.log.name}"
            else:
                lost = f"job supervisor exited with {reply.get('supervisor_exit')}; see {worker.log.name}"
            for name in ("result.json", "stdout", "stderr", PREDICTIONS_FILE):
                (job_dir / name).unlink(missing_ok=True)
        else:
            raise SandboxError(f"{lost} ({SUPERVISOR_TRIES} tries)")
        result = self._collect(job_dir)
        result.overhead_s = max(0.0, time.monotonic() - t0 - result.seconds)
        return result

    def close(self) -> None:
        """Stop every worker and delete the jobs folder."""
        with self._cond:
            self._closed = True
            workers, self._idle = self._idle, []
        for w in workers:
            w.close()
        shutil.rmtree(self.jobs_root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def worker_pids(self) -> list[int]:
        """Host pids of the idle workers (for tests: a job must not be able to kill them)."""
        with self._cond:
            return [w.proc.pid for w in self._idle]

    # --- internals ------------------------------------------------------------------------------
    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("sandbox is closed")
                while self._idle:
                    w = self._idle.pop()
                    if w.alive():
                        return w
                    self._slots.append(w.slot)
                    w.close()
                if self._slots:
                    slot = self._slots.pop()
                    break
                self._cond.wait()
        try:
            return _Worker(self, slot)
        except BaseException:
            with self._cond:
                self._slots.append(slot)
                self._cond.notify()
            raise

    def _release(self, worker: _Worker, healthy: bool) -> None:
        if not (healthy and self.config.warm) or self._closed:
            worker.close()
            with self._cond:
                self._slots.append(worker.slot)
                self._cond.notify()
            return
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def _collect(self, job_dir: Path) -> SandboxResult:
        try:
            info = json.loads((job_dir / "result.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SandboxError(f"no result from the job supervisor in {job_dir}: {e}") from e
        stdout, stderr = _tail(job_dir / "stdout"), _tail(job_dir / "stderr")
        for name in ("stdout", "stderr", "solution.py"):  # keep only what callers need on disk
            (job_dir / name).unlink(missing_ok=True)
        preds = job_dir / PREDICTIONS_FILE
        code = int(info["exit_code"])
        if info["timed_out"]:
            status, msg = "timeout", f"wall-clock timeout after {info['seconds']:.1f} s"
        elif code < 0:
            sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            status, msg = "killed", f"killed by {sig} (memory, CPU-time or process limit, or a signal)"
        elif code != 0:
            status, msg = "error", f"exit code {code}"
            if info.get("status_error"):
                msg += f" ({info['status_error']})"
        elif not preds.exists():
            status, msg = "invalid", info.get("predictions") or "no predictions file"
        else:
            status, msg = "ok", ""
        self._done.append(job_dir)
        while len(self._done) > KEEP_JOB_DIRS:
            shutil.rmtree(self._done.popleft(), ignore_errors=True)
        return SandboxResult(
            status=status,
            stdout=stdout,
            stderr=stderr,
            seconds=float(info["seconds"]),
            predictions_path=preds if preds.exists() else None,
            exit_code=code,
            message=msg,
            cpu_s=float(info.get("cpu_s", 0.0)),
            maxrss_mb=float(info.get("maxrss_mb", 0.0)),
        )

    def _job_env(self, data_dir: str) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp/work",
            "TMPDIR": "/tmp/work",
            "LANG": "C.UTF-8",
            "USER": "sandbox",  # the job's uid has no passwd entry; getpass.getuser() reads these
            "LOGNAME": "sandbox",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "TORCHINDUCTOR_CACHE_DIR": "/tmp/work/.torchinductor",
            DATA_ENV: data_dir,
            **THREAD_ENV,
        }

    def _worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in self._job_env("/tmp/data").items() if k != DATA_ENV}
        env["HOME"] = "/tmp"
        env["TMPDIR"] = "/tmp"
        return env

    def _bwrap_argv(self) -> list[str]:
        """bubblewrap arguments: an empty root with read-only binds of what Python needs.

        Mounted: ``/usr``, ``/etc``, the base interpreter's installation, the virtual environment
        (at :data:`VENV_DIR`: its ``lib`` and ``pyvenv.cfg`` only), this module's worker script (at
        :data:`WORKER_DIR`) and the public data root; never the project tree or the host's cwd. The
        packages' bundled copies of datasets (:data:`BUNDLED_DATA`) are covered by empty mounts.
        """
        argv = [
            bwrap_path() or "bwrap",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            # kept only by the worker and the per-job supervisor; the job drops them all
            *("--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"),
            *("--cap-add", "CAP_KILL", "--cap-add", "CAP_DAC_READ_SEARCH", "--cap-add", "CAP_NET_ADMIN"),
            *("--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"),
        ]
        for link in ("bin", "lib", "lib64", "sbin"):
            p = Path("/") / link
            if p.is_symlink():
                argv += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                argv += ["--ro-bind", str(p), str(p)]
        made: set[Path] = {Path("/"), Path("/usr"), Path("/etc"), Path("/tmp")}

        def parents(dst: Path) -> list[str]:
            out = []
            for parent in reversed(dst.parents):
                if parent not in made:
                    out += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            made.add(dst)
            return out

        def bind_ro(src: Path, dst: Path | None = None) -> list[str]:
            dst = src if dst is None else dst
            return [*parents(dst), "--ro-bind", str(src), str(dst)]

        tmp = Path("/tmp")
        layout = _python_layout()
        binds = [(src, dst) for src, dst in layout.binds if tmp not in dst.parents]
        late = [(src, dst) for src, dst in layout.binds if tmp in dst.parents]
        for src, dst in binds:
            argv += bind_ro(src, dst)
        for target, dst in layout.symlinks:
            argv += [*parents(dst), "--symlink", target, str(dst)]
        argv += bind_ro(Path(wmrl_research.__file__).resolve().parent / "worker.py", WORKER_DIR / "worker.py")
        argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "0755", "--tmpfs", "/tmp"]
        argv += ["--perms", "0755", "--dir", "/tmp/work", "--perms", "0755", "--dir", "/tmp/jobs"]
        # An interpreter that lives under /tmp (a CI runner's, say) is bound in after /tmp's tmpfs.
        for src, dst in late:
            argv += bind_ro(src, dst)
        for path in layout.masked_dirs:
            argv += ["--tmpfs", str(path)]
        for path in layout.masked_files:
            argv += ["--ro-bind", "/dev/null", str(path)]
        argv += ["--ro-bind", str(self.data_root), "/tmp/data", "--bind", str(self.jobs_root), "/tmp/jobs"]
        argv += ["--chdir", "/tmp"]
        return argv

    def _python(self) -> str:
        """The interpreter's path inside the sandbox."""
        return str(_python_layout().python)


def _mounted_sources() -> list[Path]:
    """The host folders and files every sandbox mounts (read-only), resolved."""
    out = [Path("/usr"), Path("/etc")]
    out += [Path("/") / link for link in ("bin", "lib", "lib64", "sbin") if (Path("/") / link).is_dir()]
    out += [src for src, _ in _python_layout().binds]
    out.append(Path(wmrl_research.__file__).resolve().parent / "worker.py")
    return [p.resolve() for p in out]


def _refuse_a_mounted_data_root(root: Path) -> None:
    """Raise :class:`SandboxError` (one line) if the data root lies under a folder that every job
    sees: there, the hidden test labels and split secrets would be readable by path (a job finds the
    root in ``/proc/self/mountinfo``)."""
    where = root.resolve()
    for src in _mounted_sources():
        if where == src or src in where.parents:
            raise SandboxError(
                f"data root {str(where)!r} ($WMRL_RESEARCH_DATA) lies under {str(src)!r}, which every "
                "sandboxed job can read: its hidden test labels would be readable; put it elsewhere "
                "(default ~/.cache/wmrl/research)"
            )


def _remove_stale() -> None:
    """Remove the jobs folders and (empty) cgroups of sandboxes whose host process died unclean
    (e.g. a pool worker killed at its timeout never runs ``close``)."""
    roots = [Path(tempfile.gettempdir())] + [p for p in cgroup_support().values() if p is not None]
    for root in roots:
        try:
            entries = list(root.glob("wmrl-sbx-*"))
        except OSError:
            continue
        for entry in entries:
            try:
                pid = int(entry.name.split("-")[2])
            except (IndexError, ValueError):
                continue
            if pid == os.getpid() or _pid_alive(pid):
                continue
            if entry.parent == Path(tempfile.gettempdir()):
                shutil.rmtree(entry, ignore_errors=True)
            else:
                for member in reversed(_cgroup_tree(entry)):
                    try:
                        member.rmdir()
                    except OSError:
                        pass


def _cgroup_tree(group: Path) -> list[Path]:
    """``group`` and the job groups inside it (parents first)."""
    try:
        return [group, *(p for p in group.iterdir() if p.is_dir())]
    except OSError:
        return [group]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _project_root() -> Path:
    return Path(wmrl_research.__file__).resolve().parent.parent


@dataclass(frozen=True)
class _Layout:
    python: Path  # the interpreter, as the sandbox sees it
    binds: tuple[tuple[Path, Path], ...]  # (host path, sandbox path), read-only
    symlinks: tuple[tuple[str, Path], ...]  # (target, sandbox path)
    masked_dirs: tuple[Path, ...]  # sandbox paths covered by an empty tmpfs
    masked_files: tuple[Path, ...]  # sandbox paths covered by an empty file


def _skip(path: Path) -> bool:
    return str(path).startswith(("/usr", "/etc", "/proc", "/dev", "/sys")) or path in (
        Path("/"),
        Path("/tmp"),
    )


@cache
def _python_layout() -> _Layout:
    """What a sandboxed interpreter needs: the base installation (at its own path) and, when this
    process runs in a virtual environment, the venv's ``lib`` and ``pyvenv.cfg`` at
    :data:`VENV_DIR` (so no path of the project that holds the venv exists inside), minus the
    bundled datasets (:data:`BUNDLED_DATA`) and anything that names the project's location."""
    base = Path(sys.base_prefix).resolve()
    binds: list[tuple[Path, Path]] = [] if _skip(base) else [(base, base)]
    symlinks: list[tuple[str, Path]] = []
    site_dirs: list[tuple[Path, Path]] = [(Path(p), Path(p)) for p in _site_dirs(base)]
    python = Path(sys.executable).resolve()
    venv = Path(sys.prefix)
    if venv.resolve() != base and (venv / "pyvenv.cfg").exists():
        binds += [
            (venv / "pyvenv.cfg", VENV_DIR / "pyvenv.cfg"),
            ((venv / "lib").resolve(), VENV_DIR / "lib"),
        ]
        if (venv / "lib64").exists():
            symlinks.append(("lib", VENV_DIR / "lib64"))
        symlinks.append((str(python), VENV_DIR / "bin" / "python"))
        site_dirs += [(s, VENV_DIR / s.relative_to(venv.resolve())) for s in _site_dirs(venv.resolve())]
        python = VENV_DIR / "bin" / "python"
    dirs: list[Path] = []
    files: list[Path] = []
    project = str(_project_root())
    for host, inside in site_dirs:
        found = {p for pattern in BUNDLED_DATA for p in host.glob(pattern)}
        for name in task_data_packages():
            if (host / name).is_dir():
                pkg_dirs, pkg_files = package_data_files(host / name)
                found.update(pkg_dirs, pkg_files)
        for p in sorted(found, key=lambda p: len(p.parts)):
            (dirs if p.is_dir() else files).append(inside / p.relative_to(host))
        # an editable install names the project's folder: hide those files too
        for p in list(host.glob("*.pth")) + list(host.glob("*.dist-info/direct_url.json")):
            try:
                if project in p.read_text(errors="replace"):
                    files.append(inside / p.relative_to(host))
            except OSError:
                pass
    # a mask's own folder must not be masked already (e.g. a tests folder inside a masked one)
    dirs = _outermost(dirs)
    masked = set(dirs)
    files = [f for f in files if not _under(f, masked)]
    return _Layout(python, tuple(binds), tuple(symlinks), tuple(dirs), tuple(files))


@cache
def task_data_packages() -> tuple[str, ...]:
    """The top-level packages any task's data builder can draw from: every non-standard-library
    package imported by a task folder's code (its ``__init__.py`` and helpers, not its solutions),
    built-in and user folders alike, and by the tasks' shared helpers. Read from their source, not
    listed by hand."""
    import ast

    from wmrl_research.task_folders import task_folders

    tasks_dir = Path(wmrl_research.__file__).resolve().parent / "tasks"
    files = [p for p in tasks_dir.glob("*.py")]
    try:
        folders = list(task_folders().values())
    except Exception:  # noqa: BLE001 (a bad user folder is reported where tasks are listed)
        folders = [p.parent for p in tasks_dir.glob("*/__init__.py")]
    for folder in folders:
        files += [p for p in folder.rglob("*.py") if p.name not in ("solution.py", "reference.py")]
    names: set[str] = set()
    for path in files:
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    skip = set(sys.stdlib_module_names) | {"wmrl_research", "__future__"}
    return tuple(sorted(n for n in names if n not in skip))


def _under(path: Path, folders: set[Path]) -> bool:
    """Whether one of ``path``'s parents is in ``folders``."""
    return any(parent in folders for parent in path.parents)


def _outermost(folders: list[Path]) -> list[Path]:
    """``folders`` less those inside another of them (order kept)."""
    keep: list[Path] = []
    seen: set[Path] = set()
    for d in sorted(set(folders), key=lambda p: len(p.parts)):
        if not _under(d, seen):
            keep.append(d)
        seen.add(d)
    return keep


def _is_code(path: Path) -> bool:
    name = path.name
    return name.endswith(CODE_SUFFIXES) or ".so." in name or name == "py.typed"


def _data_suffix(path: Path) -> bool:
    name = path.name.lower()
    for comp in COMPRESSION_SUFFIXES:
        if name.endswith(comp):
            return True  # a compressed file in a package is data
    return Path(name).suffix in DATA_SUFFIXES


def package_data_files(package_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(folders, files)`` to mask in one package: every folder whose whole tree holds no code
    (one mount each), and next to code every file with a data suffix, less :data:`RUNTIME_DATA`."""
    root = package_dir.parent
    keep = {root / p for p in RUNTIME_DATA}
    has_code: dict[Path, bool] = {}
    listing: dict[Path, list[Path]] = {}
    for dirpath, dirnames, filenames in os.walk(package_dir, topdown=False):
        d = Path(dirpath)
        listing[d] = [d / f for f in filenames]
        has_code[d] = (
            any(_is_code(d / f) for f in filenames)
            or any(has_code.get(d / sub, True) for sub in dirnames)
            or any(f in keep for f in listing[d])
        )
    dirs: list[Path] = []
    masked: set[Path] = set()
    files: list[Path] = []
    for d in sorted(listing, key=lambda p: len(p.parts)):
        if _under(d, masked):
            continue
        if not has_code[d] and d != package_dir:
            dirs.append(d)
            masked.add(d)
            continue
        files += [f for f in listing[d] if f not in keep and not _is_code(f) and _data_suffix(f)]
    return dirs, files


def _site_dirs(prefix: Path) -> list[Path]:
    """``lib/python3.X/site-packages`` (and ``dist-packages``) folders under ``prefix``."""
    out = []
    for lib in ("lib", "lib64"):
        for name in ("site-packages", "dist-packages"):
            out += [p.resolve() for p in (prefix / lib).glob(f"python3*/{name}") if p.is_dir()]
    return sorted(set(out))


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


_DEFAULT: dict[tuple, Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def default_sandbox(**overrides: object) -> Sandbox:
    """A per-process shared sandbox (started lazily; what :mod:`wmrl_research.grading` uses).

    ``$WMRL_SANDBOX_MAX_WORKERS`` (default 1) sets how many jobs one process runs at once (for
    callers that grade from several threads); a process pool or Ray gives each process its own.
    """
    if "max_workers" not in overrides:
        overrides["max_workers"] = int(os.environ.get("WMRL_SANDBOX_MAX_WORKERS", "1"))
    key = tuple(sorted(overrides.items()))
    with _DEFAULT_LOCK:
        sb = _DEFAULT.get(key)
        if sb is None or sb._closed or sb._pid != os.getpid():  # a forked child needs its own
            sb = _DEFAULT[key] = Sandbox(SandboxConfig(**overrides))  # type: ignore[arg-type]
        return sb
