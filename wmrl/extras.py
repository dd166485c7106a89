"""The optional parts of wmrl (its extras: ``vla``, ``research``, ``ray``) and the one line that says
which to install when a run needs one that is missing, and the datasets library's bars kept quiet.

What each extra requires is read from the installed wmrl's own metadata (pyproject.toml's
``[project.optional-dependencies]``); a domain names its extra on its entry point
(``vla = "wmrl_vla.config [vla]"``). A requirement counts as missing when its distribution is not
installed or none of its top-level modules can be found. Imports nothing of wmrl.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable
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


_BARS_ENV = "HF_DATASETS_DISABLE_PROGRESS_BARS"
_BARS_WARNING = "Cannot enable progress bars"


def quiet_dataset_bars() -> Callable[[], None]:
    """Turn the datasets library's "Map" bars off (wmrl's own bars show each stage; a domain that
    writes a dataset, e.g. the VLA anchors' LeRobot dataset, would draw one per write); returns the
    function that turns them back as they were (the CLI never calls it: quiet for the whole command).

    Its environment variable is set (``=0`` given keeps the bars): datasets reads it when first
    imported, and it outlasts lerobot's ``SuppressProgressBars``, whose exit turns the bars back on;
    a datasets already imported has its bars turned off. The warning that exit then raises is
    ignored here and, through ``PYTHONWARNINGS``, in every worker process spawned meanwhile (a grid's
    cells run in spawned processes that inherit the environment, not the warning filters); the
    filter stays. If datasets is first imported before the undo, its bars stay off for the rest of
    the process (the variable it read at import has the last word)."""
    was = {name: os.environ.get(name) for name in (_BARS_ENV, "PYTHONWARNINGS")}
    os.environ.setdefault(_BARS_ENV, "1")
    warnings.filterwarnings("ignore", message=_BARS_WARNING, category=UserWarning)
    ignore = f"ignore:{_BARS_WARNING}:UserWarning"
    inherited = os.environ.get("PYTHONWARNINGS", "")
    if ignore not in inherited.split(","):
        os.environ["PYTHONWARNINGS"] = f"{inherited},{ignore}" if inherited else ignore
    imported = sys.modules.get("datasets")
    datasets = imported if os.environ[_BARS_ENV] != "0" and imported is not None else None
    turned_off = datasets is not None and datasets.is_progress_bar_enabled()
    if datasets is not None and turned_off:
        datasets.disable_progress_bars()

    def undo() -> None:
        for name, value in was.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if datasets is not None and turned_off:
            datasets.enable_progress_bars()

    return undo
