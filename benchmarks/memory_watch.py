"""Memory measurement shared by the memory benchmarks: a process's resident set, and a child
process run under a resident-memory cap (``vla_rollout_memory.py``, ``vla_step_memory.py``,
``metaworld_env_memory.py``)."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path


def resident_gb(pid: int | str = "self") -> float:
    """A process's resident set (``/proc/<pid>/statm``'s second field, pages), in GB."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def run_watched(cmd: list[str], cap_gb: float, label: str) -> tuple[resource.struct_rusage, list[str]]:
    """Run ``cmd``, polling its resident set every 0.2 s and killing it past ``cap_gb`` (a
    measurement must not take the machine's memory from other jobs); returns its resource usage
    (``ru_maxrss``: its peak, kB) and its stdout lines. Stops with a message naming ``label`` when
    it passed the cap, failed, or printed nothing."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    watched = 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            watched = max(watched, resident_gb(proc.pid))
        except (FileNotFoundError, ProcessLookupError):
            pass
        if watched > cap_gb:
            proc.kill()
            raise SystemExit(f"{label}: resident {watched:.2f} GB passed --cap-gb={cap_gb}; stopped")
        time.sleep(0.2)
    assert proc.stdout is not None
    lines = proc.stdout.read().strip().splitlines()
    if os.waitstatus_to_exitcode(status) != 0 or not lines:
        raise SystemExit(f"{label} failed: {' '.join(cmd)}")
    return usage, lines
