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
  path), the worker package (``sandbox_worker``, standard library only), all read-only, plus its
  own task's public data (read-only, at ``$WMRL_DATA_DIR``; no other task's folder) and a fresh tmpfs per job (size-limited: the disk
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
  longer than ``sandbox_worker.supervisor.MAX_STATUS_BYTES`` is graded as a failed run and ends
  the job (so flooding the pipe costs the supervisor at most one bounded read). A source that is not valid UTF-8 text (a lone
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
worker (``SUPERVISOR_TRIES``), not graded, and the lost worker's cgroups are removed; so is a job
OOM-killed from outside (the host's global OOM killer, when another process exhausts the machine's
memory), which only the memory cgroup tells from its own limits (``sandbox_worker.supervisor.
killed_from_outside``: ``oom_kill``, ``memory.failcnt``, ``RLIMIT_CPU``); killed so twice: :class:`SandboxError`.
Without cgroups such a kill is graded ``killed``; only cgroup v1 controllers are
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
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from wmrl_research.sandbox_config import DEFAULT_PRELOAD as DEFAULT_PRELOAD
from wmrl_research.sandbox_config import STATUSES as STATUSES
from wmrl_research.sandbox_config import THREAD_ENV, SandboxConfig, SandboxResult
from wmrl_research.sandbox_host import MAX_SLOTS as MAX_SLOTS
from wmrl_research.sandbox_host import UID_BASE as UID_BASE
from wmrl_research.sandbox_host import (
    SandboxError,
    _cgroup_tree,
    _remove_stale,
    bwrap_path,
    cgroup_support,
    job_status,
    job_uid,
    outside_kill,
    tail,
)
from wmrl_research.sandbox_mounts import BUNDLED_DATA as BUNDLED_DATA
from wmrl_research.sandbox_mounts import RUNTIME_DATA as RUNTIME_DATA
from wmrl_research.sandbox_mounts import VENV_DIR as VENV_DIR
from wmrl_research.sandbox_mounts import (
    WORKER,
    _python_layout,
    _refuse_a_mounted_data_root,
    bwrap_argv,
)
from wmrl_research.sandbox_mounts import package_data_files as package_data_files
from wmrl_research.sandbox_mounts import task_data_packages as task_data_packages
from wmrl_research.tasks.base import DATA_ENV, PREDICTIONS_FILE, data_root

TAIL_CHARS = 4000
# cgroup memory for the worker process itself (its pre-imported libraries), on top of the job's.
WORKER_MEMORY_MB = 1536
KEEP_JOB_DIRS = 32
SUPERVISOR_TRIES = 2  # a job whose supervisor or worker was lost runs again once, on a fresh worker
_WORKER_IDS = itertools.count()  # process-wide: names each worker's cgroups uniquely


CGROUP_DIR = "/tmp/cgroup"  # the worker's memory/cpuacct cgroups, inside (sandbox_worker.common's)


class _Worker:
    """One bwrap process running :mod:`wmrl_research.sandbox_worker` (pre-imported when warm)."""

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
        argv = sandbox._bwrap_argv() + binds + [sandbox._python(), str(WORKER), json.dumps(config)]
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
        self.outside_kills = 0  # jobs OOM-killed outside their limits (each ran again or raised)
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
        # A supervisor (or worker) lost to the host, or a job killed from outside (module doc), is not
        # the solution's failure: the job runs again on a fresh worker (the lost one is closed, its
        # cgroups removed), at most SUPERVISOR_TRIES times.
        for _ in range(SUPERVISOR_TRIES):
            worker = self._acquire()
            healthy = outside = False
            try:
                worker.send(req)
                reply = worker.read_reply(timeout=timeout_s + 30.0)
                healthy = (
                    reply is not None
                    and reply.get("job") == job
                    and reply.get("supervisor_exit") == 0
                    and worker.alive()
                )
                outside = healthy and outside_kill(job_dir)
                healthy = healthy and not outside
            except (BrokenPipeError, OSError, json.JSONDecodeError):
                reply = None
            finally:
                self._release(worker, healthy)
            if healthy:
                break
            if outside:
                with self._cond:
                    self.outside_kills += 1
                lost = (
                    f"{job} was OOM-killed from outside its own limits (its memory group's oom_kill "
                    "rose, its own memory limit was not hit: the host's or an ancestor group's OOM killer)"
                )
            elif reply is None:
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
        stdout, stderr = tail(job_dir / "stdout", TAIL_CHARS), tail(job_dir / "stderr", TAIL_CHARS)
        for name in ("stdout", "stderr", "solution.py"):  # keep only what callers need on disk
            (job_dir / name).unlink(missing_ok=True)
        preds = job_dir / PREDICTIONS_FILE
        code = int(info["exit_code"])
        status, msg = job_status(info, preds.exists())
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
        """bubblewrap arguments: an empty root with read-only binds of what Python needs
        (:func:`wmrl_research.sandbox_mounts.bwrap_argv`)."""
        return bwrap_argv(self.data_root, self.jobs_root)

    def _python(self) -> str:
        """The interpreter's path inside the sandbox."""
        return str(_python_layout().python)


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
