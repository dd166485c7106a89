"""The job process: PID 1 of a fresh PID namespace, forked ahead of time by its supervisor. On its
request it hides the other jobs, sets its rlimits, drops to the job's uid, installs its seccomp
filter and runs ``solution.py`` in-process."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback

from .common import (
    CGROUP_DIR,
    DATA_DIR,
    JOBS_DIR,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    SOLUTION,
    WORK_DIR,
    libc,
    mount,
)
from .seccomp import install_seccomp, seccomp_program

AS_SLACK_MB = 4096  # address space a job may map beyond its memory limit (stacks, lazy imports)
PR_SET_PDEATHSIG = 1
STATUS_FD = 1023  # where the job reports its exit code (kept across the close of other fds)


def run_job(go_fd: int, status_fd: int, setup_fd: int) -> None:
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
        mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.setsid()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
                mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
        # Only this job's task data stays visible: its folder is bound over the whole data root.
        task_data = str(req["data"])
        if task_data.startswith("/") or ".." in task_data.split("/") or not task_data.strip("/"):
            raise ValueError(f"bad data folder {task_data!r}")
        mount(os.path.join(DATA_DIR, task_data), DATA_DIR, None, MS_BIND | MS_REC)
        program = seccomp_program()
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
        install_seccomp(program)
        os.chdir(WORK_DIR)
        with open(SOLUTION, "w") as f:
            f.write(source)
        os.environ.clear()
        os.environ.update(req["env"])
        if "tempfile" in sys.modules:  # forget the worker's cached temp dir: use $TMPDIR
            import tempfile  # already imported: no file is read

            tempfile.tempdir = None
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
