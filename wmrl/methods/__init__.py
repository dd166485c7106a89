"""The training methods, one object each in a registry (``METHODS``; the contract is
wmrl/methods/base.py). A new method is one file here: subclass :class:`Method`, decorate it with
:func:`register_method` and import the file below (or anywhere before the config is parsed); its
settings, if it has any, are a :class:`wmrl.method_config.MethodConfig` dataclass beside it, named
by its ``config`` attribute (a run's ``method_config``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from wmrl.config import load_methods
from wmrl.methods.base import (
    METHODS,
    Advantages,
    Control,
    Method,
    Step,
    get_method,
    register_method,
    wm_methods,
)
from wmrl.methods.placebo import Placebo
from wmrl.methods.ppi_lambda0 import PPILambda0

# isort: off
# Each file registers its method; the import order is the order the CLI, the reports and
# `compare.methods` list them in.
from wmrl.methods import real, anchors_only, wm, mix, debias, denoise, wmrl, ppi  # noqa: F401

# isort: on

if TYPE_CHECKING:
    from wmrl.config import RunConfig

__all__ = [
    "METHODS",
    "Advantages",
    "Control",
    "Method",
    "PPILambda0",
    "Placebo",
    "Step",
    "controls",
    "get_method",
    "method_of",
    "register_method",
    "wm_methods",
]


def method_of(run: RunConfig) -> Method:
    """The method object that trains ``run``: its registered ``method``, wrapped in its placebo
    under ``wm_placebo``."""
    method = get_method(run.method)
    return Placebo(method) if run.wm_placebo else method


def controls() -> dict[str, Control]:
    """Every registered method's controls by name: each WM method's placebo (``wmrl_placebo``), then
    its own (``ppi_lambda0``)."""
    methods = cast("dict[str, Method]", load_methods())  # the entry points' methods included
    return {c.name: c for m in methods.values() for c in ([Placebo(m)] if m.uses_wm else []) + m.controls()}
