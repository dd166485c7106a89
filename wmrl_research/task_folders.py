"""Where research tasks live: the package's own folder and the folders a user adds. Light to import
(no numpy, no task is imported): the config checks task ids with it before anything is built.

A tasks folder holds one sub-folder per task (``<id>/__init__.py`` defining ``SPEC``,
``<id>/solution.py``, optionally ``<id>/reference.py``; see ``wmrl_research/tasks/README.md``). The
package's folder comes first; then every folder of ``$WMRL_RESEARCH_TASKS`` (separated by
``os.pathsep``), which ``domain.task_dirs`` extends, so that execution workers started by the run
(they inherit the environment) find the same tasks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TASKS_ENV = "WMRL_RESEARCH_TASKS"
PACKAGE_DIR = Path(__file__).resolve().parent / "tasks"
# A task id names data folders and cache files: lower-case letters, digits, "_" and "-".
TASK_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
TASK_ID_RULE = "lower-case letters, digits, '_' and '-', starting with a letter or digit"


class TaskDefinitionError(ValueError, RuntimeError):
    """A task folder that does not define a valid task (the message names the task and the fix).

    Also a RuntimeError, so that command-line entry points report it as a one-line error."""


def user_dirs() -> list[Path]:
    """The folders of ``$WMRL_RESEARCH_TASKS``, in order, without repeats."""
    raw = os.environ.get(TASKS_ENV, "")
    return list(dict.fromkeys(Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p))


def add_user_dirs(dirs: list[str]) -> None:
    """Append ``dirs`` to ``$WMRL_RESEARCH_TASKS`` (this process and the workers it starts later).
    Raises FileNotFoundError naming the first folder that does not exist."""
    for d in dirs:
        if not Path(d).expanduser().is_dir():
            raise FileNotFoundError(
                f"domain.task_dirs: no folder {d!r}; give folders that hold one sub-folder per task"
            )
    paths = [*user_dirs(), *(Path(d).expanduser().resolve() for d in dirs)]
    os.environ[TASKS_ENV] = os.pathsep.join(str(p) for p in dict.fromkeys(paths))


def task_folders() -> dict[str, Path]:
    """Task id -> its folder: the package's tasks, then every user folder's (sorted by id within a
    folder). A sub-folder counts as a task if it holds ``__init__.py``; one that holds a
    ``solution.py`` but no ``__init__.py`` raises :class:`TaskDefinitionError` (it looks like a task
    that would be skipped in silence); names starting with ``_`` or ``.`` are skipped. An id that is not :data:`TASK_ID_RE` or that two folders share raises
    :class:`TaskDefinitionError` naming the folder(s)."""
    out: dict[str, Path] = {}
    for root in [PACKAGE_DIR, *user_dirs()]:
        if not root.is_dir():
            raise TaskDefinitionError(
                f"${TASKS_ENV}: no folder {str(root)!r}; give folders that hold one sub-folder per task"
            )
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            task_id = folder.name
            if task_id.startswith(("_", ".")):
                continue
            if not (folder / "__init__.py").is_file():
                if (folder / "solution.py").is_file():  # a task folder, but Python cannot import it
                    raise TaskDefinitionError(
                        f"task folder {str(folder)!r} has a solution.py but no __init__.py: a task is "
                        "defined by SPEC = TaskSpec(...) in its __init__.py (wmrl_research/tasks/README.md)"
                    )
                continue  # a data folder, say
            if not TASK_ID_RE.fullmatch(task_id):
                raise TaskDefinitionError(
                    f"task folder {str(folder)!r}: a task id is {TASK_ID_RULE}; rename the folder"
                )
            if task_id in out:
                raise TaskDefinitionError(
                    f"task id {task_id!r} is defined twice: {str(out[task_id])!r} and {str(folder)!r}; "
                    "rename one of the folders"
                )
            out[task_id] = folder
    return out
