"""The worker's entry point: ``python /opt/wmrl/sandbox_worker '<config JSON>'`` (run by
:class:`wmrl_research.sandbox.Sandbox` inside bwrap) serves requests until stdin closes."""

import importlib
import json
import os
import sys


def _package() -> str:
    """This package's import name; when the folder is run as a script (no package), its parent
    folder replaces the folder itself on ``sys.path`` so that its modules' relative imports work."""
    if __package__:
        return __package__
    folder = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(folder)
    return os.path.basename(folder)


if __name__ == "__main__":
    importlib.import_module(f"{_package()}.serve").serve(json.loads(sys.argv[1]))
