"""Peak memory of a VLA run's held-out re-evaluation against ``domain.eval_lockstep`` (episodes
simulated at once, each with its own MuJoCo env and renderer), side by side in one invocation.

    uv run python benchmarks/vla_eval_memory.py RUN_DIR --n 200 --lockstep 400 64 \
        --out benchmarks/results/vla_eval_memory.json

Each setting re-evaluates the run's starting and final policy (``benchmarks/reeval_run.py``) in a
fresh process; its peak resident memory is the ``ru_maxrss`` that ``os.wait4`` reports for it
(the largest of the process and its waited-for children). The
greedy success rates must not depend on the setting, and the JSON records them to show it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REEVAL = Path(__file__).with_name("reeval_run.py")


def measure(run_dir: Path, n: int, lockstep: int) -> dict:
    """Peak RSS (GB), wall-clock (s) and the success rates of one re-evaluation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reeval.json"
        cmd = [sys.executable, str(REEVAL), str(run_dir), "--n", str(n), "--out", str(out),
               "--domain.n_videos=0", f"--domain.eval_lockstep={lockstep}"]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"re-evaluation with eval_lockstep={lockstep} failed: {' '.join(cmd)}")
        report = json.loads(out.read_text())
    return {
        "eval_lockstep": lockstep,
        "peak_rss_gb": usage.ru_maxrss / 1e6,  # kilobytes on Linux
        "wall_s": wall,
        "success": {k: report[k]["eval"]["success"] for k in ("start", "final")},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--n", type=int, default=200, help="held-out episodes per task")
    p.add_argument("--lockstep", type=int, nargs="+", default=[400, 64])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    rows = []
    for lockstep in a.lockstep:
        rows.append(measure(a.run_dir, a.n, lockstep))
        print(json.dumps(rows[-1]), flush=True)
    result = {"run_dir": str(a.run_dir), "episodes_per_task": a.n, "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
