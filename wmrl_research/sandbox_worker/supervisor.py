"""The per-job supervisor: forked ahead of time, it builds the job's namespaces and forks the job;
on the request it times the job, kills and reaps it, measures it (never from the job's own word),
copies its predictions, cleans up after it and writes its ``result.json``."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import time

from .common import (
    JOBS_DIR,
    MQUEUE_DIR,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PREDICTIONS,
    WORK_DIR,
    check,
    libc,
    mount,
)
from .job import run_job
from .job_resources import JobCgroups, loopback_up, mount_job_tmpfs, remove_ipc_objects, unmount_job_tmpfs

MAX_PREDICTIONS_BYTES = 64 * 2**20
MAX_STATUS_BYTES = 4096  # a status report longer than this (without a newline) is garbled: the job fails
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000


def supervise(
    req_fd: int, done_fd: int, uid: int, disk_mb: int, cgroups: list[str], job_memory: int | None = None
) -> None:
    """The per-job supervisor, forked ahead of time (still privileged inside the sandbox).

    Prepares the namespaces, the job's tmpfs and the job process *before* the request arrives, so
    a request costs a pipe write instead of two forks of a large process.
    """
    # The supervisor shares the job's IPC namespace so that it can remove what the job left. A
    # network namespace per job: no socket state (TIME_WAIT, abstract unix names) outlives the job.
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET), "unshare")
    loopback_up()
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount_job_tmpfs(uid, disk_mb)
    os.makedirs(MQUEUE_DIR, exist_ok=True)
    mount("mqueue", MQUEUE_DIR, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this IPC namespace's
    # The job mounts its own /proc over this mount namespace's: keep a handle on the worker's view.
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    groups = JobCgroups(cgroups, job_memory)
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
        run_job(go_r, st_w, setup_w)
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
    hits_before, oom_before = groups.memory_limit_hits(), groups.oom_kills()
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
    hits, ooms = groups.memory_limit_hits(), groups.oom_kills()
    if hits is not None and hits_before is not None and ooms is not None and oom_before is not None:
        limit_hit = hits > hits_before  # decidable only with the job's memory group
        info["memory_limit_hit"] = limit_hit
        info["outside_kill"] = killed_from_outside(
            status, exited and not reported, info["cpu_s"], float(req["cpu_s"]), limit_hit, ooms > oom_before
        )
    why = _copy_predictions(dir_fd)
    remove_ipc_objects(proc_fd, uid)
    unmount_job_tmpfs()
    groups.remove()
    _write_json_at(
        dir_fd, "result.json", {**info, "timed_out": timed_out, "seconds": seconds, "predictions": why}
    )
    os.write(done_fd, b"d")
    os.close(pidfd)
    os.close(proc_fd)


def killed_from_outside(
    status: int, died: bool, cpu_s: float, cpu_limit_s: float, memory_limit_hit: bool, oom_killed: bool
) -> bool:
    """Whether the job was SIGKILLed by an OOM killer that none of its own limits explains: the
    host's (another process ran the machine out of memory) or an ancestor cgroup's.

    ``oom_killed``: its memory group's ``oom_kill`` count rose, so an OOM killer, not a signal,
    killed it: a job that SIGKILLs itself (or is killed by an operator) stays its own failure, or a
    solution could turn any failure into an ungraded rollout with ``os.kill(os.getpid(), 9)``.

    ``status``: its wait status; ``died``: it ended before it reported an exit code or ran out of its
    wall-clock time (else the supervisor killed it; and a reported -9 is only the job's own word).
    Its own limits that SIGKILL: its memory group's (or the worker's) OOM killer
    (``memory_limit_hit``) and ``RLIMIT_CPU``'s hard limit, ``cpu_limit_s`` + 1 s of one process's
    CPU time (``cpu_s``, the job's measured CPU time, reaches ``cpu_limit_s`` by then: its setup,
    left out of it, is far below 1 s). An OOM kill that none of these explains is outside the job.
    """
    if not died or not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGKILL:
        return False
    return oom_killed and not memory_limit_hit and cpu_s < cpu_limit_s


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


def _usage(usage: resource.struct_rusage) -> dict:
    """CPU time and peak memory of a reaped job, from the kernel's accounting (``wait4``).

    ``cpu_s`` = user + system time of the job and of every process of its namespace that was
    waited for (the namespace's teardown waits for all that are left); ``maxrss_mb`` = the largest
    peak resident set of one of those processes (shared pages of the warm worker included). A
    process reaped by the kernel because its parent ignores SIGCHLD is in neither figure: where the
    host gives the worker cgroups, :class:`JobCgroups` measures instead.
    """
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_mb": usage.ru_maxrss / 1024}


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
