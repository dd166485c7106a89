"""The optional parts of wmrl (its extras: ``vla``, ``research``, ``ray``) and the one line that says
which to install when a run needs one that is missing.

What each extra requires is read from the installed wmrl's own metadata (pyproject.toml's
``[project.optional-dependencies]``); a domain names its extra on its entry point
(``vla = "wmrl_vla.config [vla]"``). A requirement counts as missing when its distribution is not
installed or none of its top-level modules can be found. Imports nothing of wmrl.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import metadata, util

DIST = "wmrl"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def extra_requirements() -> dict[str, tuple[str, ...]]:
    """extra -> the distribution names it requires (``{}`` where wmrl is not installed)."""
    try:
        reqs = metadata.requires(DIST) or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for req in reqs:
        extra = re.search(r"extra\s*==\s*[\"']([\w.-]+)[\"']", req)
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if extra and name and _normalize(name.group(0)) != DIST:  # `all` lists wmrl's own extras
            out.setdefault(extra.group(1), []).append(name.group(0))
    return {k: tuple(v) for k, v in out.items()}


@cache
def _top_modules() -> dict[str, tuple[str, ...]]:
    """Normalized distribution name -> its top-level import names (installed distributions)."""
    out: dict[str, list[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for d in dists:
            out.setdefault(_normalize(d), []).append(module)
    return {k: tuple(v) for k, v in out.items()}


def _importable(module: str) -> bool:
    try:
        return util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(extra: str) -> list[str]:
    """The requirements of ``extra`` that cannot be imported here (empty: it is installed)."""
    absent = []
    for name in extra_requirements().get(extra, ()):
        tops = [m for m in _top_modules().get(_normalize(name), ()) if m.isidentifier()]
        if not any(_importable(m) for m in tops):
            absent.append(name)
    return absent


def missing_extra_message(extra: str, needed_by: str) -> str | None:
    """One line naming the missing extra, what needs it and the command that installs it; None
    when ``extra`` is installed (or is none of wmrl's)."""
    absent = missing(extra)
    if not absent:
        return None
    return (
        f"{needed_by} needs the {extra} extra, which is not installed (missing: {', '.join(absent)}): "
        f"pip install 'wmrl[{extra}]' (in a checkout: uv sync --extra {extra})"
    )


def domain_extras(domain_type: str) -> list[str]:
    """The extras a domain names on its ``wmrl.domains`` entry point (none for the toy)."""
    for ep in metadata.entry_points(group="wmrl.domains"):
        if ep.name == domain_type:
            return list(ep.extras)
    return []
