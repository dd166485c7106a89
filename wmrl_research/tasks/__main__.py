"""``python -m wmrl_research.tasks [list|measure] [TASK_ID ...]``.

``measure`` runs each task's baseline and reference solutions in the sandbox and prints their raw
scores, wall-clock and CPU seconds: the numbers a task author copies into ``SPEC``.
"""

from __future__ import annotations

import argparse
import json

from wmrl_research.tasks import get_task, list_tasks, task_lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m wmrl_research.tasks")
    parser.add_argument("command", choices=["list", "measure"])
    parser.add_argument("task_ids", nargs="*")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(task_lines()))
        return
    from wmrl_research.grading import execute_raw

    tasks = [get_task(t) for t in args.task_ids] if args.task_ids else list_tasks()
    for task in tasks:
        row: dict[str, object] = {"id": task.id, "split": task.split, "metric": task.metric}
        for name, source in (("baseline", task.baseline_source), ("reference", task.reference_source)):
            r = execute_raw(task.id, source, timeout_s=args.timeout)
            row[name] = r.raw_score
            row[f"{name}_s"] = round(r.seconds, 3)
            row[f"{name}_cpu_s"] = round(r.cpu_s, 3)
            if not r.ok:
                row[f"{name}_error"] = r.message
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
