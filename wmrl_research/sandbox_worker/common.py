"""The sandbox's paths, the mount flags and the libc calls that the worker's modules share."""

from __future__ import annotations

import ctypes
import os

JOBS_DIR = "/tmp/jobs"
WORK_DIR = "/tmp/work"
SOLUTION = "solution.py"
PREDICTIONS = "predictions.npy"
DATA_DIR = "/tmp/data"  # every task's public data (bwrap); a job sees only its own task's folder here
CGROUP_DIR = "/tmp/cgroup"  # the worker's own memory/cpuacct cgroups, when the host uses them
MQUEUE_DIR = "/dev/mqueue"  # the job's POSIX message queues (a fresh mqueue fs per job)
SHM_DIR = "/dev/shm"  # the job's POSIX shared memory and semaphores (part of its tmpfs)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18

libc = ctypes.CDLL(None, use_errno=True)


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    check(
        libc.mount(
            src.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )
