"""When a stop signal is a second one: the rule ``wmrl.tracking.StopSignals`` (training) and the
CLI's SIGTERM handler (outside training) share. Imports nothing heavy (the CLI's start-up)."""

from __future__ import annotations

import time

# A signal within this many seconds of the first is a copy of it, not a deliberate second one:
# `uv run` forwards to its child the SIGTERM that `kill -- -PGID`, Slurm or Kubernetes send to the
# whole process group, so the run receives that one signal twice, milliseconds apart.
SIGNAL_GRACE_S = 1.0


def repeated_signal(first_at: float | None, grace_s: float | None = None) -> bool:
    """Whether a signal arriving now is a deliberate second one: there was a first (at
    ``time.monotonic()`` ``first_at``), at least ``grace_s`` (default ``SIGNAL_GRACE_S``) ago."""
    grace = SIGNAL_GRACE_S if grace_s is None else grace_s
    return first_at is not None and time.monotonic() - first_at >= grace
