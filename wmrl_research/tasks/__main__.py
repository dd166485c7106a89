"""``python -m wmrl_research.tasks [list|measure] [TASK_ID ...]``.

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

from wmrl_research.tasks import get_task, list_tasks, task_lines

PROG = "python -m wmrl_research.tasks"


def _last_line(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return lines[0] + (f": {lines[-1]}" if len(lines) > 1 else "") if lines else "no message"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("command", choices=["list", "measure"])
    parser.add_argument("task_ids", nargs="*")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print("\n".join(task_lines()))
            return 0
        tasks = [get_task(t) for t in args.task_ids] if args.task_ids else list_tasks()
    except (KeyError, RuntimeError) as e:  # an unknown id; a task folder that defines no task
        print(f"{PROG}: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
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


if __name__ == "__main__":
    sys.exit(main())
