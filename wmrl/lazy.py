"""Heavy libraries imported on first use, so that the CLI's quick commands (``--help``, ``config``,
``tasks``, ``presets``, ``status``, any parse error) start in well under a second: importing torch
and scikit-learn takes seconds, many more on a loaded machine, and none of those commands needs
them. A module that needs torch only inside its functions writes::

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy("torch")

``torch`` is then imported (into ``sys.modules``, as usual) the first time one of its attributes is
read; annotations stay strings (``from __future__ import annotations``). A module that uses torch at
import time (a class deriving from ``torch.nn.Module``) imports it as usual.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _LazyModule(types.ModuleType):
    """Stands for the module ``name``: the first attribute read imports it; every read goes through
    to the module itself (nothing is copied, so a test that patches ``torch.save`` patches it here
    too)."""

    def __getattr__(self, attr: str) -> Any:
        module = sys.modules.get(self.__name__) or importlib.import_module(self.__name__)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy(name: str) -> Any:
    """A stand-in for ``import name`` that imports it on first attribute access."""
    return _LazyModule(name)
