"""``--merge`` arguments shared by the benchmark scripts: a path, optionally ``:method,method``."""

from __future__ import annotations

from pathlib import Path


def split_merge_arg(spec: str) -> tuple[Path, set[str] | None]:
    """``"PATH"`` -> (PATH, None: every method); ``"PATH:real,wmrl"`` -> (PATH, {"real", "wmrl"})."""
    path, sep, methods = spec.rpartition(":")
    if not sep or "/" in methods:
        return Path(spec), None
    return Path(path), set(methods.split(","))
