"""The process that runs *inside* a bubblewrap sandbox and executes solutions, one job at a time.

Started by :class:`wmrl_research.sandbox.Sandbox` as ``python -m wmrl_research.worker '<config>'``
inside ``bwrap`` (no network, read-only system, a tmpfs ``/tmp``). A warm worker pre-imports the
heavy libraries (numpy, scikit-learn, torch, ...) once, so a job costs a fork instead of 1.5-2 s
of imports. Ahead of each job (while the previous one runs, or right after it) it forks a
*supervisor* that

1. enters a new mount, PID and IPC namespace (other jobs' folders, processes and System V / POSIX
   IPC objects become invisible),
2. mounts a fresh size-limited tmpfs that serves as the job's working folder and as its
   ``/dev/shm``, and a fresh ``mqueue`` file system at ``/dev/mqueue``,
3. forks the *job* process (PID 1 of the new namespace: when it dies the kernel kills every
   process the job started, so nothing outlives it), which mounts its own read-only ``/proc``
   and waits; where the host gave the worker cgroups (bound at ``CGROUP_DIR``), the job is moved
   into ``cpuacct``/``memory`` groups of its own (the CPU time it spends on the sandbox's setup is
   subtracted from its figure).

When a request arrives the job opens its stdout/stderr in its host folder, hides every job folder
(and the cgroups) under an empty tmpfs, sets rlimits, drops to an unprivileged uid (losing every
capability) and runs ``solution.py`` in-process. The supervisor waits at most the wall-clock
timeout (then SIGKILLs the job, hence its whole namespace), reaps it, takes its CPU time and peak
memory from the job's cgroups (else from ``wait4``; never from the job), copies ``predictions.npy``
(a regular file, bounded size, no symlinks), removes every IPC object and tmpfs the job left (so
their memory is free before the next job starts) and writes a ``result.json`` into the job's host
folder.

Protocol: one JSON request per line on stdin, one JSON reply per line on the original stdout
(fd 1 is redirected to stderr so that nothing else can write a reply). This module only imports
the standard library at top level: it must start fast and must not import the project's heavy code.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import select
import signal
import sys
import time
import traceback

JOBS_DIR = "/tmp/jobs"
WORK_DIR = "/tmp/work"
MAX_PREDICTIONS_BYTES = 64 * 2**20
AS_SLACK_MB = 4096  # address space a job may map beyond its memory limit (stacks, lazy imports)
PREFORK_GRACE_S = 0.03  # a job that ends within this is answered before the next chain is forked
SOLUTION = "solution.py"
PREDICTIONS = "predictions.npy"

DATA_DIR = "/tmp/data"  # every task's public data (bwrap); a job sees only its own task's folder here
MAX_STATUS_BYTES = 4096  # a status report longer than this (without a newline) is garbled: the job fails
CGROUP_DIR = "/tmp/cgroup"  # the worker's own memory/cpuacct cgroups, when the host uses them
MQUEUE_DIR = "/dev/mqueue"  # the job's POSIX message queues (a fresh mqueue fs per job)
SHM_DIR = "/dev/shm"  # the job's POSIX shared memory and semaphores (part of its tmpfs)
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2
IPC_RMID = 0
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1
# Syscalls the job may not make, per architecture: the kernel keyring (keyctl, add_key, request_key),
# io_uring (its operations bypass seccomp, e.g. IORING_OP_SOCKET), socket(AF_UNIX, ...)
# (pathname and abstract unix sockets; socketpair() stays allowed, which multiprocessing.Pipe uses)
# and new user namespaces: unshare/clone with CLONE_NEWUSER fail with EPERM; clone3, whose flags a
# seccomp filter cannot read, fails with ENOSYS (the C library then falls back to clone).
_ARCH = {  # machine -> (AUDIT_ARCH_*, socket, (unshare, clone), clone3, denied: keyctl, add_key, ...)
    "x86_64": (0xC000003E, 41, (272, 56), 435, (250, 248, 249, 425, 426, 427)),
    "aarch64": (0xC00000B7, 198, (97, 220), 435, (219, 217, 218, 425, 426, 427)),
}

# socketpair: only SOCK_STREAM is allowed (multiprocessing, asyncio). A datagram or seqpacket pair can
# be disconnected (connect(AF_UNSPEC)) and then sendto() any unix socket on a path the job can see.
_SOCKETPAIR = {"x86_64": 53, "aarch64": 199}
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(
        _libc.mount(
            src.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _write_json_at(dir_fd: int, name: str, obj: dict) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)


def _copy_predictions(dir_fd: int) -> str:
    """Copy the job's predictions to its host folder; returns '' or why nothing was copied."""
    try:
        fd = os.open(os.path.join(WORK_DIR, PREDICTIONS), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "no predictions.npy written"
    except OSError as e:
        return f"predictions.npy unreadable: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000):
            return "predictions.npy is not a regular file"
        if st.st_size > MAX_PREDICTIONS_BYTES:
            return f"predictions.npy is {st.st_size} bytes (> {MAX_PREDICTIONS_BYTES})"
        out = os.open(PREDICTIONS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
        try:
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                os.write(out, chunk)
                left -= len(chunk)
        finally:
            os.close(out)
        return ""
    finally:
        os.close(fd)


STATUS_FD = 1023  # where the job reports its exit code (kept across the close of other fds)


def _seccomp_program() -> bytes:
    """A classic-BPF seccomp filter (``struct sock_filter[]``) for this machine's architecture.

    Another architecture's syscalls (e.g. i386 ``socketcall`` from an x86-64 process) kill the job;
    x32 syscall numbers fail with ENOSYS. ``unshare``/``clone`` are checked on their flags (the
    first argument's low 32 bits): ``CLONE_NEWUSER`` fails with EPERM.
    """
    import errno
    import platform
    import struct

    machine = platform.machine()
    if machine not in _ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp filter for architecture {machine!r}")
    arch, sys_socket, with_flags, sys_clone3, denied = _ARCH[machine]
    ld, jeq, jge, jset, ret, alu_and = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
    allow, kill = 0x7FFF0000, 0x80000000

    def err(code: int) -> int:
        return 0x00050000 | code

    ins = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":
        ins += [(jge, 0, 1, 0x40000000), (ret, 0, 0, err(errno.ENOSYS))]
    for nr in denied:
        ins += [(jeq, 0, 1, nr), (ret, 0, 0, err(errno.EPERM))]
    ins += [(jeq, 0, 1, sys_clone3), (ret, 0, 0, err(errno.ENOSYS))]
    for nr in with_flags:  # this syscall: refuse CLONE_NEWUSER in args[0], allow anything else
        ins += [(jeq, 0, 4, nr), (ld, 0, 0, 16), (jset, 0, 1, CLONE_NEWUSER), (ret, 0, 0, err(errno.EPERM))]
        ins += [(ret, 0, 0, allow)]
    # socketpair: the type (args[1], less SOCK_NONBLOCK/SOCK_CLOEXEC) must be SOCK_STREAM
    ins += [(jeq, 0, 5, _SOCKETPAIR[machine]), (ld, 0, 0, 24), (alu_and, 0, 0, SOCK_TYPE_MASK)]
    ins += [(jeq, 1, 0, SOCK_STREAM), (ret, 0, 0, err(errno.EAFNOSUPPORT)), (ret, 0, 0, allow)]
    ins += [(jeq, 0, 3, sys_socket), (ld, 0, 0, 16), (jeq, 0, 1, 1), (ret, 0, 0, err(errno.EAFNOSUPPORT))]
    ins += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def _install_seccomp(program: bytes) -> None:
    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = _Prog(len(program) // 8, ctypes.cast(buf, ctypes.c_char_p))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def _join_new_session_keyring() -> None:
    """Replace the session keyring inherited from the host by a new, empty one (for every job)."""
    import platform

    nr = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
    if nr is None:
        return  # the job's seccomp filter refuses to start on an unknown architecture anyway
    _libc.syscall.restype = ctypes.c_long
    if _libc.syscall(nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err not in (38, 1):  # ENOSYS / EPERM: no keyring support here, nothing to inherit
            raise OSError(err, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")


def _run_job(go_fd: int, status_fd: int, setup_fd: int) -> None:
    """The job process: PID 1 of a fresh PID namespace, forked ahead of time. Never returns.

    It waits (still privileged) for its request on ``go_fd``; then opens its output files in the
    job's host folder, hides every job folder, limits itself, drops to the job's uid and runs the
    solution in-process (the pre-imported modules make its imports free).
    """
    code = 1
    try:
        # Opened now, written once the request arrives (the job's own /proc is read-only by then).
        oom_fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        # Read-only: no write to /proc/self/clear_refs, which would reset the peak-memory figure.
        _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.setsid()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        with os.fdopen(go_fd, "rb") as f:
            data = f.read()
        if not data:  # the worker is shutting down
            os._exit(0)
        go_cpu_ns = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
        # The OOM killer takes the running job, not the worker; set only now, so that while this
        # process waits (pre-forked during an earlier job) it is no likelier a victim than the worker.
        os.write(oom_fd, b"1000")
        os.close(oom_fd)
        req = json.loads(data)
        job_dir = os.path.join(JOBS_DIR, req["job"])
        with open(os.path.join(job_dir, SOLUTION)) as f:
            source = f.read()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        out_fd = os.open(os.path.join(job_dir, "stdout"), flags, 0o644)
        err_fd = os.open(os.path.join(job_dir, "stderr"), flags, 0o644)
        for hidden in (JOBS_DIR, CGROUP_DIR):
            if os.path.isdir(hidden):
                _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
        # Only this job's task data stays visible: its folder is bound over the whole data root.
        data = str(req["data"])
        if data.startswith("/") or ".." in data.split("/") or not data.strip("/"):
            raise ValueError(f"bad data folder {data!r}")
        _mount(os.path.join(DATA_DIR, data), DATA_DIR, None, MS_BIND | MS_REC)
        program = _seccomp_program()
        # Setup done: the CPU time this process spent on it since the request is the sandbox's, not
        # the solution's (written before any solution code runs, so the solution cannot change it).
        now_ns = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
        os.write(setup_fd, f"{now_ns} {now_ns - go_cpu_ns}".encode())  # since the fork; since the request
        os.close(setup_fd)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.dup2(status_fd, STATUS_FD)
        os.closerange(3, STATUS_FD)  # the worker's protocol pipes
        os.closerange(STATUS_FD + 1, 65536)
        _set_limits(req)
        uid = int(req["uid"])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # from here on: no capabilities, no way back
        _install_seccomp(program)
        os.chdir(WORK_DIR)
        with open(SOLUTION, "w") as f:
            f.write(source)
        os.environ.clear()
        os.environ.update(req["env"])
        if "tempfile" in sys.modules:  # forget the worker's cached temp dir: use $TMPDIR
            sys.modules["tempfile"].tempdir = None
        sys.argv = [SOLUTION]
        sys.path[0] = WORK_DIR
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fresh objects: no lock held by the worker)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        code = 0
        try:
            compiled = compile(source, os.path.join(WORK_DIR, SOLUTION), "exec")
            exec(compiled, {"__name__": "__main__", "__file__": os.path.join(WORK_DIR, SOLUTION)})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            # Only the exit code: the supervisor measures CPU time and memory itself.
            os.write(STATUS_FD, (json.dumps({"code": code}) + "\n").encode())
            # Wait to be killed: the supervisor takes the CPU time first, so the teardown of this
            # large process (forked from the warm worker) is not charged to the job.
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                time.sleep(0.5)
        except BaseException:
            pass
        finally:
            os._exit(code)


def _set_limits(req: dict) -> None:
    cpu = int(req["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    disk = int(req["disk_mb"]) * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_NPROC, (int(req["nproc"]), int(req["nproc"])))
    # An absolute RLIMIT_AS would forbid importing torch. Both limits are set relative to what is
    # already mapped (the pre-imported libraries): RLIMIT_DATA caps the private heap the job adds;
    # RLIMIT_AS also caps shared anonymous mappings (which RLIMIT_DATA does not count), with slack for
    # thread stacks and for the address space that importing torch reserves in a cold worker.
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmData", "VmSize"):
                status[key] = int(value.split()[0]) * 1024
    mem = int(req["mem_mb"]) * 2**20
    data = status.get("VmData", 0) + mem
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    space = status.get("VmSize", 0) + mem + AS_SLACK_MB * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (space, space))


def _supervise(
    req_fd: int, done_fd: int, uid: int, disk_mb: int, cgroups: list[str], job_memory: int | None = None
) -> None:
    """The per-job supervisor, forked ahead of time (still privileged inside the sandbox).

    Prepares the namespaces, the job's tmpfs and the job process *before* the request arrives, so
    a request costs a pipe write instead of two forks of a large process.
    """
    # The supervisor shares the job's IPC namespace so that it can remove what the job left. A
    # network namespace per job: no socket state (TIME_WAIT, abstract unix names) outlives the job.
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET), "unshare")
    _loopback_up()
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount_job_tmpfs(uid, disk_mb)
    os.makedirs(MQUEUE_DIR, exist_ok=True)
    _mount("mqueue", MQUEUE_DIR, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this IPC namespace's
    # The job mounts its own /proc over this mount namespace's: keep a handle on the worker's view.
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    groups = _JobCgroups(cgroups, job_memory)
    go_r, go_w = os.pipe()
    st_r, st_w = os.pipe()
    setup_r, setup_w = os.pipe()  # the job's CPU time spent on the sandbox's setup, from trusted code
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(req_fd)
        os.close(st_r)
        os.close(done_fd)
        os.close(setup_r)
        _run_job(go_r, st_w, setup_w)
    os.close(go_r)
    os.close(st_w)
    pidfd = os.pidfd_open(pid)
    os.close(setup_w)
    groups.enter(pid)
    with os.fdopen(req_fd, "rb") as f:
        line = f.readline()
    if not line:  # shutting down: the job reads EOF and exits
        os.close(go_w)
        os.waitpid(pid, 0)
        groups.remove()
        return
    req = json.loads(line)
    dir_fd = os.open(os.path.join(JOBS_DIR, req["job"]), os.O_RDONLY | os.O_DIRECTORY)
    # The job's CPU time so far (forked, waiting) is the sandbox's; so is its setup after the request
    # (it reports that itself, from trusted code, before the solution runs): neither is charged.
    before = groups.usage().get("cpu_s", 0.0)
    t0 = time.monotonic()
    os.write(go_w, line)
    os.close(go_w)
    deadline = t0 + float(req["timeout_s"])
    report = b""
    exited = False
    watch = [pidfd, st_r]
    while True:  # until the job reports its exit code, exits, or runs out of time
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(watch, [], [], left)
        if st_r in ready:
            chunk = os.read(st_r, MAX_STATUS_BYTES + 1 - len(report))
            if not chunk:  # closed (it died, or closed the pipe itself): the pidfd decides
                watch.remove(st_r)
            report += chunk
            if b"\n" in report or len(report) > MAX_STATUS_BYTES:  # a report, or a flood: stop reading
                break
        if pidfd in ready:
            exited = True
            break
    seconds = time.monotonic() - t0
    reported = b"\n" in report or len(report) > MAX_STATUS_BYTES
    timed_out = not reported and not exited
    # CPU time up to the report: the job's own work. What follows (the kernel tearing down a process
    # forked from the large warm worker: unmapping its address space, ~10 ms) is the sandbox's cost.
    at_report = groups.usage().get("cpu_s") if reported else None
    os.kill(pid, signal.SIGKILL)  # the job's PID namespace dies with it
    # The namespace's init is reaped only after every process in it is gone (a fork bomb's too: they
    # would count against the next job's process limits, same uid), their memory released.
    _, status, usage = os.wait4(pid, 0)
    info = _parse_status(report) if reported else {"exit_code": os.waitstatus_to_exitcode(status)}
    info.update(_usage(usage))
    info.update(groups.usage())  # all of the job's processes, where the host gives it cgroups
    if at_report is not None:
        info["cpu_s"] = at_report
    since_fork, since_request = _setup_cpu_s(setup_r)
    if "cpuacct" in groups.parents:  # the group's usage before the request, then the job's setup
        info["cpu_s"] -= before + since_request
    else:  # wait4: the job's whole life since its fork
        info["cpu_s"] -= since_fork
    info["cpu_s"] = max(0.0, info["cpu_s"])
    why = _copy_predictions(dir_fd)
    _remove_ipc_objects(proc_fd, uid)
    _unmount_job_tmpfs()
    groups.remove()
    _write_json_at(
        dir_fd, "result.json", {**info, "timed_out": timed_out, "seconds": seconds, "predictions": why}
    )
    os.write(done_fd, b"d")
    os.close(pidfd)
    os.close(proc_fd)


def _setup_cpu_s(fd: int) -> tuple[float, float]:
    """The job's CPU time spent on the sandbox's setup before its solution started, since its fork
    and since its request, as its trusted code wrote them on ``fd``; zeros if it never got that far."""
    try:
        os.set_blocking(fd, False)
        words = os.read(fd, 64).split()
    except OSError:
        words = []
    finally:
        os.close(fd)
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return 0.0, 0.0
    return int(words[0]) * 1e-9, int(words[1]) * 1e-9


def _loopback_up() -> None:
    """Bring up ``lo`` in this (new) network namespace, as bwrap does in its own."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack("16sH14x", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _usage(usage: resource.struct_rusage) -> dict:
    """CPU time and peak memory of a reaped job, from the kernel's accounting (``wait4``).

    ``cpu_s`` = user + system time of the job and of every process of its namespace that was
    waited for (the namespace's teardown waits for all that are left); ``maxrss_mb`` = the largest
    peak resident set of one of those processes (shared pages of the warm worker included). A
    process reaped by the kernel because its parent ignores SIGCHLD is in neither figure: where the
    host gives the worker cgroups, :class:`_JobCgroups` measures instead.
    """
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_mb": usage.ru_maxrss / 1024}


class _JobCgroups:
    """A job's own cgroups (v1), inside the worker's ``memory``/``cpuacct`` groups under CGROUP_DIR.

    They count every process of the job, however it is reaped: ``cpuacct.usage`` (ns) is its CPU
    time and ``memory.max_usage_in_bytes`` the peak of the memory charged to it (heap, page cache,
    tmpfs, shared memory; not the warm worker's pages it shares). The worker's limit is copied to
    the job's memory group, so it holds on a kernel without hierarchical accounting too. Paths are
    held as descriptors: the job covers CGROUP_DIR with an empty tmpfs.
    """

    FIGURES = {
        "cpuacct": ("cpuacct.usage", "cpu_s", 1e-9),
        "memory": ("memory.max_usage_in_bytes", "maxrss_mb", 2**-20),
    }

    def __init__(self, controllers: list[str], memory_bytes: int | None = None) -> None:
        self.name = f"job-{os.getpid()}"
        self.parents: dict[str, int] = {}
        for ctl in controllers:
            parent = os.open(os.path.join(CGROUP_DIR, ctl), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.rmdir(self.name, dir_fd=parent)  # left by a supervisor that died with this pid
            except FileNotFoundError:
                pass
            os.mkdir(self.name, dir_fd=parent)
            self.parents[ctl] = parent
            if ctl == "memory":  # the job's own cap, below the worker's: a job's OOM stays in its group
                limit = int(self._read(ctl, "memory.limit_in_bytes", own=False))
                if memory_bytes:
                    limit = min(limit, int(memory_bytes))
                self._write(ctl, "memory.limit_in_bytes", str(limit))

    def _read(self, ctl: str, name: str, own: bool = True) -> str:
        fd = os.open(os.path.join(self.name, name) if own else name, os.O_RDONLY, dir_fd=self.parents[ctl])
        with os.fdopen(fd) as f:
            return f.read().strip()

    def _write(self, ctl: str, name: str, value: str) -> None:
        fd = os.open(os.path.join(self.name, name), os.O_WRONLY, dir_fd=self.parents[ctl])
        with os.fdopen(fd, "w") as f:
            f.write(value)

    def enter(self, pid: int) -> None:
        """Move the job process (not started yet) into its groups; its children follow. (Here, off
        the request's path: moving a process between cgroups waits for an RCU grace period.)"""
        for ctl in self.parents:
            self._write(ctl, "cgroup.procs", str(pid))

    def usage(self) -> dict:
        """``cpu_s`` and ``maxrss_mb`` of the (reaped) job, for the controllers there are."""
        out = {}
        for ctl in self.parents:
            file, key, scale = self.FIGURES[ctl]
            out[key] = int(self._read(ctl, file)) * scale
        return out

    def remove(self) -> None:
        for parent in self.parents.values():
            os.rmdir(self.name, dir_fd=parent)
            os.close(parent)
        self.parents = {}


def _mount_job_tmpfs(uid: int, disk_mb: int) -> None:
    """One tmpfs of ``disk_mb`` for the job: its folder ``work`` at ``WORK_DIR`` and ``shm`` at
    ``SHM_DIR`` (POSIX shared memory and semaphores, e.g. ``multiprocessing``'s locks), both owned
    by ``uid``; so the disk limit covers both and unmounting frees both."""
    _mount("tmpfs", WORK_DIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0700")
    for name, mode in (("shm", 0o1777), ("work", 0o700)):
        path = os.path.join(WORK_DIR, name)
        os.mkdir(path)
        os.chown(path, uid, uid)
        os.chmod(path, mode)
    _mount(os.path.join(WORK_DIR, "shm"), SHM_DIR, None, MS_BIND)
    _mount(os.path.join(WORK_DIR, "work"), WORK_DIR, None, MS_BIND)  # covers the tmpfs' root


def _unmount_job_tmpfs() -> None:
    """Unmount the job's tmpfs (its folder and ``/dev/shm``): its memory is freed now, not when the
    supervisor's mount namespace goes."""
    for target in (SHM_DIR, WORK_DIR, WORK_DIR):  # the bind over the tmpfs' root, then the tmpfs
        _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _remove_ipc_objects(proc_fd: int, uid: int) -> None:
    """Remove every System V shared-memory segment, message queue and semaphore set and every POSIX
    message queue of this IPC namespace (the job's: the supervisor shares it), once the job is gone.

    The namespace would free them when the supervisor exits too, but only after the next job may
    have started; removing them here returns their memory (charged to the worker's cgroup) first.
    """
    ctl = {"shm": _libc.shmctl, "msg": _libc.msgctl, "sem": lambda i, cmd, _: _libc.semctl(i, 0, cmd)}
    for kind, remove in ctl.items():
        fd = os.open(f"sysvipc/{kind}", os.O_RDONLY, dir_fd=proc_fd)
        with os.fdopen(fd) as f:
            ids = [int(line.split()[1]) for line in f.readlines()[1:] if line.strip()]
        for ipc_id in ids:
            _check(remove(ipc_id, IPC_RMID, None), f"{kind}ctl(IPC_RMID)")
    # /dev/mqueue is sticky: unlink the job's queues as the job's uid
    os.seteuid(uid)
    try:
        for name in os.listdir(MQUEUE_DIR):
            os.unlink(os.path.join(MQUEUE_DIR, name))
    finally:
        os.seteuid(0)


def _parse_status(report: bytes) -> dict:
    """The job's status report, exactly ``{"code": <int>}``, checked; anything else (malformed,
    another field) is a failed run (exit code 1). Its CPU time and memory are never taken from it."""
    garbled = {"exit_code": 1, "status_error": "garbled status report"}
    if b"\n" not in report:
        return garbled
    try:
        msg = json.loads(report.split(b"\n", 1)[0])
        code = msg["code"] if type(msg) is dict and msg.keys() == {"code"} else None
    except Exception:  # noqa: BLE001 (RecursionError, OverflowError, ...: anything is a bad report)
        return garbled
    if type(code) is not int or not -255 <= code <= 255:
        return garbled
    return {"exit_code": code}


def _prefork(config: dict) -> tuple[int, int, int, int]:
    """Fork the next job's supervisor; returns ``(pid, pidfd, request pipe, done pipe)``."""
    req_r, req_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(req_w)
            os.close(done_r)
            _supervise(
                req_r,
                done_w,
                int(config["uid"]),
                int(config["disk_mb"]),
                config.get("cgroups", []),
                config.get("job_memory"),
            )
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(70)
    os.close(req_r)
    os.close(done_w)
    return pid, os.pidfd_open(pid), req_w, done_r


def _lines(fd: int):
    """Lines from ``fd`` via ``os.read`` (no buffered-reader lock held while waiting)."""
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        yield line


def _serve(config: dict) -> None:
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints from libraries go to the log, never into the protocol

    def reply(obj: dict) -> None:
        os.write(reply_fd, (json.dumps(obj) + "\n").encode())

    _join_new_session_keyring()  # before any job is forked: none inherits the host's keys
    t0 = time.monotonic()
    failed = []
    for name in config.get("preload", []):
        try:
            importlib.import_module(name)
        except Exception as e:  # a missing optional library must not stop the worker
            failed.append(f"{name}: {e}")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
    import gc

    gc.collect()
    gc.freeze()  # keep the pre-imported objects' pages shared with the forked jobs
    nxt: tuple[int, int, int, int] | None = _prefork(config)
    reply({"ready": True, "preload_s": time.monotonic() - t0, "preload_failed": failed})
    exited: list[tuple[int, int]] = []  # supervisors that reported "done" but may not be reaped yet
    for line in _lines(0):
        exited = [z for z in exited if not _reaped(*z)]
        req = json.loads(line)
        req["uid"] = config["uid"]
        chain, nxt = nxt or _prefork(config), None
        pid, pidfd, req_w, done_r = chain
        try:
            os.write(req_w, (json.dumps(req) + "\n").encode())
        except BrokenPipeError:
            pass
        os.close(req_w)
        # The supervisor reports "done" before its (slow) exit; its exit status is the backstop.
        # Forking the next chain blocks this process for tens of ms: do it while a job runs longer
        # than PREFORK_GRACE_S, else right after replying (in the host's idle time).
        budget = float(req["timeout_s"]) + 15.0
        ready, _, _ = select.select([done_r, pidfd], [], [], min(PREFORK_GRACE_S, budget))
        if not ready:
            nxt = _prefork(config)
            ready, _, _ = select.select([done_r, pidfd], [], [], budget)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        done = done_r in ready and os.read(done_r, 1) == b"d"
        os.close(done_r)
        if done:
            reply({"job": req["job"], "supervisor_exit": 0})
            exited.append((pid, pidfd))
        else:
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            reply({"job": req["job"], "supervisor_exit": os.waitstatus_to_exitcode(status) or 70})
        if nxt is None:
            nxt = _prefork(config)
    if nxt is not None:
        os.close(nxt[2])
        exited.append((nxt[0], nxt[1]))
    for pid, _ in exited:
        os.waitpid(pid, 0)


def _reaped(pid: int, pidfd: int) -> bool:
    """Reap ``pid`` if it has exited (without blocking)."""
    if os.waitpid(pid, os.WNOHANG)[0] == 0:
        return False
    os.close(pidfd)
    return True


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
