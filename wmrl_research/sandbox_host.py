"""The host side of a :mod:`wmrl_research.sandbox`: the unprivileged uid of each worker slot's jobs,
bubblewrap, the cgroup v1 controllers this process may use, and the removal of what a sandbox
whose host process died left behind. (Moved out of wmrl_research/sandbox.py unchanged; its names
are importable from there too.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from functools import cache
from pathlib import Path

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


def job_status(info: dict, has_predictions: bool) -> tuple[str, str]:
    """A job's ``SandboxResult.status`` and message from its supervisor's ``result.json`` (``info``)."""
    code = int(info["exit_code"])
    if info["timed_out"]:
        return "timeout", f"wall-clock timeout after {info['seconds']:.1f} s"
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        why = "out of its memory" if info.get("memory_limit_hit") else "memory, CPU-time or process limit"
        return "killed", f"killed by {sig} ({why}, or a signal)"
    if code != 0:
        why = f" ({info['status_error']})" if info.get("status_error") else ""
        return "error", f"exit code {code}{why}"
    if not has_predictions:
        return "invalid", info.get("predictions") or "no predictions file"
    return "ok", ""


def outside_kill(job_dir: Path) -> bool:
    """Whether the job's supervisor found it OOM-killed outside its own limits (``outside_kill``
    in its ``result.json``: ``sandbox_worker.supervisor.killed_from_outside``; absent without the
    job's memory cgroup, and from results of older workers: False)."""
    try:
        return json.loads((job_dir / "result.json").read_text()).get("outside_kill") is True
    except (OSError, ValueError, AttributeError):
        return False


def tail(path: Path, chars: int) -> str:
    """The last ``chars`` bytes of the file at ``path``, decoded ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


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
