"""Re-evaluate one run directory's starting and final policy on the held-out split, on the same
episodes or samples, as a comparison grid's re-evaluation does (``wmrl.grid``) but for a run made
with ``wmrl run``.

    uv run python benchmarks/reeval_run.py RUN_DIR --n 200 --out reeval.json [--domain.x=y ...]

``--n``: held-out episodes or samples per task (the domain's ``HELDOUT_SIZE`` field); further
``--a.b=value`` overrides apply to both evaluations (e.g. ``--domain.n_videos=0``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    from wmrl.config import load_config
    from wmrl.grid import Cell, _evaluate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--n", type=int, required=True, help="held-out episodes or samples per task")
    p.add_argument("--out", type=Path, required=True)
    a, extra = p.parse_known_args(argv)
    saved = a.run_dir / "config.yaml"
    if not (a.run_dir / "checkpoints" / "latest.pt").exists() or not saved.exists():
        p.error(f"{a.run_dir} holds no finished run (config.yaml and checkpoints/latest.pt)")
    over = [f"--out_dir={a.run_dir}", *extra]
    size = type(load_config(str(saved), over).domain).HELDOUT_SIZE
    cell = Cell("", "", 0, str(saved), over, [f"--domain.{size}={a.n}"] if size else [], str(a.run_dir), "")
    report = {"n": a.n, "overrides": extra, "start": _evaluate(cell, None),
              "final": _evaluate(cell, a.run_dir / "checkpoints" / "latest.pt")}  # fmt: skip
    a.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k]["eval"] for k in ("start", "final")}, indent=2))
    return report


if __name__ == "__main__":
    main()
