"""``python -m wmrl_research.tasks [list|measure|check] [TASK_ID ...]``.

``check`` runs the conformance check (:mod:`wmrl_research.tasks.conformance`: definition, data,
then baseline and reference in the sandbox) of the tasks named, or, without ids, of every task in
the folders of ``$WMRL_RESEARCH_TASKS`` (a user's own): one line per task, ``ok`` or its problems,
exit status 0 when every task conforms, 1 otherwise. ``--no-run`` skips the execution.

``measure`` runs each task's baseline and reference solutions in the sandbox and prints their raw
scores, wall-clock and CPU seconds: the numbers a task author copies into ``SPEC``. Exit status 0
when every baseline and reference ran and each reference beats its baseline; 1 otherwise (one
``error:`` line per problem on stderr, naming the task and the solution's last error line); 2 for
bad input (an unknown task id, a task folder that does not define a task).
"""

from __future__ import annotations

import argparse
import json
import sys

from wmrl_research.task_folders import PACKAGE_DIR, TASKS_ENV, task_folders
from wmrl_research.tasks import get_task, list_tasks, task_lines

PROG = "python -m wmrl_research.tasks"


def _last_line(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return lines[0] + (f": {lines[-1]}" if len(lines) > 1 else "") if lines else "no message"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("command", choices=["list", "measure", "check"])
    parser.add_argument("task_ids", nargs="*")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--no-run", action="store_true", help="check: skip executing the solutions")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print("\n".join(task_lines()))
            return 0
        if args.command == "check" and not args.task_ids:
            tasks = [get_task(t) for t in user_task_ids()]
            if not tasks:
                raise RuntimeError(
                    f"no task of your own to check: ${TASKS_ENV} names no folder holding one (or name task ids)"
                )
        else:
            tasks = [get_task(t) for t in args.task_ids] if args.task_ids else list_tasks()
    except (KeyError, RuntimeError) as e:  # an unknown id; a task folder that defines no task
        print(f"{PROG}: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    if args.command == "check":
        return _check(tasks, not args.no_run, args.timeout)
    from wmrl_research.grading import execute_raw

    problems = []
    for task in tasks:
        row: dict[str, object] = {"id": task.id, "split": task.split, "metric": task.metric}
        for name, source in (("baseline", task.baseline_source), ("reference", task.reference_source)):
            r = execute_raw(task.id, source, timeout_s=args.timeout)
            row[name] = r.raw_score
            row[f"{name}_s"] = round(r.seconds, 3)
            row[f"{name}_cpu_s"] = round(r.cpu_s, 3)
            if not r.ok:
                row[f"{name}_error"] = r.message
                problems.append(
                    f"task {task.id}: its {name} solution failed ({r.status}): {_last_line(r.message)}; "
                    "no rollout of the task can be graded until it runs"
                )
        base, ref = row["baseline"], row["reference"]
        if base is not None and ref is not None and (ref - base) * task.direction <= 0:
            better = "higher" if task.direction > 0 else "lower"
            problems.append(
                f"task {task.id}: its reference ({ref:.6g}) does not beat its baseline ({base:.6g}) on "
                f"{task.metric} ({better} is better); make the reference stronger"
            )
        print(json.dumps(row), flush=True)
    for line in problems:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    return 1 if problems else 0


def user_task_ids() -> list[str]:
    """The ids of the tasks in the folders of ``$WMRL_RESEARCH_TASKS`` (not the package's)."""
    return [i for i, folder in task_folders().items() if folder.parent != PACKAGE_DIR]


def _check(tasks: list, execute: bool, timeout: float) -> int:
    from wmrl_research.tasks.conformance import conformance

    failed = 0
    for task in tasks:
        problems = conformance(task, execute=execute, timeout_s=timeout)
        failed += bool(problems)
        print(f"task {task.id}: ok" if not problems else "\n".join(problems), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
