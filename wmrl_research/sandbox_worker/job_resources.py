"""What a supervisor gives its job and takes back after it: a network namespace's loopback, a
size-limited tmpfs (its folder and ``/dev/shm``), the IPC objects it leaves (removed) and, where the
host gives the worker cgroups, groups of its own that measure it (:class:`JobCgroups`)."""

from __future__ import annotations

import os
from collections.abc import Callable  # already imported at the worker's start (by traceback)

from .common import (
    CGROUP_DIR,
    MQUEUE_DIR,
    MS_BIND,
    MS_NODEV,
    MS_NOSUID,
    SHM_DIR,
    WORK_DIR,
    check,
    libc,
    mount,
)

MNT_DETACH = 2
IPC_RMID = 0
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring up ``lo`` in this (new) network namespace, as bwrap does in its own."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack("16sH14x", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


class JobCgroups:
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

    def memory_limit_hits(self) -> int | None:
        """How often a charge met the job's memory limit or the worker's (``memory.failcnt`` of both
        groups: each such charge reclaims, then OOM-kills in the group if reclaim fails); None without
        a memory group. A host's global OOM kill, or an ancestor group's, raises neither count, while
        :meth:`oom_kills` rises for every OOM kill: the two together tell an outside OOM kill."""
        if "memory" not in self.parents:
            return None
        return sum(int(self._read("memory", "memory.failcnt", own=own)) for own in (True, False))

    def oom_kills(self) -> int | None:
        """Processes of the job's memory group killed by an OOM killer (the ``oom_kill`` line of its
        ``memory.oom_control``): its own group's, an ancestor group's or the host's global one, all
        counted in the victim's group; None without a memory group. A kill by a signal (the job's
        own ``kill -9`` included) does not count."""
        if "memory" not in self.parents:
            return None
        for line in self._read("memory", "memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def remove(self) -> None:
        for parent in self.parents.values():
            os.rmdir(self.name, dir_fd=parent)
            os.close(parent)
        self.parents = {}


def mount_job_tmpfs(uid: int, disk_mb: int) -> None:
    """One tmpfs of ``disk_mb`` for the job: its folder ``work`` at ``WORK_DIR`` and ``shm`` at
    ``SHM_DIR`` (POSIX shared memory and semaphores, e.g. ``multiprocessing``'s locks), both owned
    by ``uid``; so the disk limit covers both and unmounting frees both."""
    mount("tmpfs", WORK_DIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0700")
    for name, mode in (("shm", 0o1777), ("work", 0o700)):
        path = os.path.join(WORK_DIR, name)
        os.mkdir(path)
        os.chown(path, uid, uid)
        os.chmod(path, mode)
    mount(os.path.join(WORK_DIR, "shm"), SHM_DIR, None, MS_BIND)
    mount(os.path.join(WORK_DIR, "work"), WORK_DIR, None, MS_BIND)  # covers the tmpfs' root


def unmount_job_tmpfs() -> None:
    """Unmount the job's tmpfs (its folder and ``/dev/shm``): its memory is freed now, not when the
    supervisor's mount namespace goes."""
    for target in (SHM_DIR, WORK_DIR, WORK_DIR):  # the bind over the tmpfs' root, then the tmpfs
        check(libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def remove_ipc_objects(proc_fd: int, uid: int) -> None:
    """Remove every System V shared-memory segment, message queue and semaphore set and every POSIX
    message queue of this IPC namespace (the job's: the supervisor shares it), once the job is gone.

    The namespace would free them when the supervisor exits too, but only after the next job may
    have started; removing them here returns their memory (charged to the worker's cgroup) first.
    """
    ctl: dict[str, Callable[[int, int, None], int]] = {
        "shm": libc.shmctl,
        "msg": libc.msgctl,
        "sem": lambda i, cmd, _: libc.semctl(i, 0, cmd),
    }
    for kind, remove in ctl.items():
        fd = os.open(f"sysvipc/{kind}", os.O_RDONLY, dir_fd=proc_fd)
        with os.fdopen(fd) as f:
            ids = [int(line.split()[1]) for line in f.readlines()[1:] if line.strip()]
        for ipc_id in ids:
            check(remove(ipc_id, IPC_RMID, None), f"{kind}ctl(IPC_RMID)")
    # /dev/mqueue is sticky: unlink the job's queues as the job's uid
    os.seteuid(uid)
    try:
        for name in os.listdir(MQUEUE_DIR):
            os.unlink(os.path.join(MQUEUE_DIR, name))
    finally:
        os.seteuid(0)
