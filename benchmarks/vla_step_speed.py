"""Time of a VLA GRPO step, this checkout against another one (a baseline commit), side by side.

    git worktree add /tmp/vla-base <base commit> && (cd /tmp/vla-base && uv sync --frozen)
    uv run python benchmarks/vla_step_speed.py --base /tmp/vla-base --method real --steps 2 --pairs 3 \
        --out benchmarks/results

Each *pair* runs the same fixed-seed run twice, once with this checkout's code and once with the
baseline's (each in its own process and its own virtual environment, the order alternating from pair
to pair), on the same cached SFT policy and world model (``--cache-dir``: both checkouts must key it
the same way). A process builds the domain (not timed), runs ``--warmup`` training steps untimed (a
process's first steps pay one-off costs: the first convolutions' kernel set-up and memory; measured,
the first step's update takes several times a later one's), then times ``--steps`` steps. On a
loaded machine only a ratio measured side by side means anything: the figure is the median over pairs of (baseline step time / this step time),
per phase too (``time/generate``, ``time/update``, ...). The runs' final policy parameters and
per-step metrics are compared as well (``same_results``: max absolute parameter difference, and
whether every step's reward metrics agree), so a speed-up that changed the run shows.

``--profile FILE``: one run of this checkout under cProfile (the step only), top functions printed.
Writes ``OUT/vla_step_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


CONTROL_NOTE = (
    "anchors_only not run: one method's step timed in two checkouts (a speed and equality check of "
    "the code), not a comparison of methods; no WM claim rests on it"
)


def worker(args: argparse.Namespace) -> None:
    """One run: build (not timed), ``--steps`` timed steps; prints one JSON line (and saves params)."""
    import torch

    from wmrl.config import load_config
    from wmrl.trainer import Trainer

    cfg = load_config(
        args.preset,
        [f"--out_dir={tempfile.mkdtemp(prefix='wmrl-step-speed-')}", f"--domain.cache_dir={args.cache_dir}",
         f"--method={args.method}", f"--seed={args.seed}", f"--grpo.steps={args.warmup + args.steps}",
         "--tracking.eval_every=0", "--tracking.progress=false", *args.override],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    trainer = Trainer(cfg, domain)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
    warmup = [{k: float(v) for k, v in trainer.train_step().items()} for _ in range(args.warmup)]
    steps, t0 = [], time.perf_counter()
    for _ in range(args.steps):
        if prof is not None:
            prof.enable()
        m = trainer.train_step()
        if prof is not None:
            prof.disable()
        steps.append({k: float(v) for k, v in m.items()})
    total = time.perf_counter() - t0
    if prof is not None:
        import pstats

        prof.dump_stats(args.profile)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    params = torch.cat([p.detach().flatten() for p in domain.policy.parameters()])
    torch.save(params, args.params_out)
    domain.close()
    print(json.dumps({"warmup": warmup, "steps": steps, "seconds": total}))


def run_one(python: str, root: Path, args: argparse.Namespace, params_out: Path) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--worker", "--preset", args.preset, "--method", args.method,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed), "--cache-dir", str(args.cache_dir),
           "--params-out", str(params_out), *(f"--override={o}" for o in args.override)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "LP_NUM_THREADS"}  # each checkout's own default
    env |= {"HF_HUB_OFFLINE": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"the run in {root} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def phases(run: dict) -> dict[str, float]:
    """Seconds per phase over the run's steps (``time/step`` and every ``time/*`` the steps logged)."""
    keys = sorted({k for s in run["steps"] for k in s if k.startswith("time/") and k != "time/elapsed"})
    return {k: sum(s.get(k, 0.0) for s in run["steps"]) for k in keys}


def compare(args: argparse.Namespace) -> dict:
    import torch

    base = Path(args.base).resolve()
    pythons = {"new": (sys.executable, HERE), "base": (str(base / ".venv" / "bin" / "python"), base)}
    work = Path(tempfile.mkdtemp(prefix="wmrl-step-speed-"))
    pairs = []
    for k in range(args.pairs):
        order = ("new", "base") if k % 2 == 0 else ("base", "new")
        runs = {}
        for name in order:
            py, root = pythons[name]
            runs[name] = run_one(py, root, args, work / f"{name}{k}.pt")
            print(f"pair {k} {name}: {phases(runs[name])}", file=sys.stderr)
        pairs.append(runs)
    ratio = {
        key: statistics.median(
            p["base"][key] / p["new"][key]
            for p in map(lambda r: {n: phases(r[n]) for n in r}, pairs)
            if p["new"].get(key)
        )
        for key in phases(pairs[0]["new"])
    }
    p_new, p_base = torch.load(work / "new0.pt"), torch.load(work / "base0.pt")
    reward_keys = ("reward/mean", "reward/anchor_true", "adv/abs_mean", "loss/policy")
    same_metrics = all(
        all(
            s_new.get(key) == s_base.get(key)
            or (s_new.get(key) != s_new.get(key) and s_base.get(key) != s_base.get(key))
            for key in reward_keys
        )
        for s_new, s_base in zip(
            pairs[0]["new"]["warmup"] + pairs[0]["new"]["steps"],
            pairs[0]["base"]["warmup"] + pairs[0]["base"]["steps"],
            strict=True,
        )
    )
    return {
        "command": " ".join(sys.argv),
        "control": CONTROL_NOTE,
        "base": str(base),
        "preset": args.preset,
        "method": args.method,
        "warmup_steps_per_run": args.warmup,
        "steps_per_run": args.steps,
        "pairs": args.pairs,
        "speedup_median": ratio,
        "seconds": [{n: phases(r[n]) for n in r} for r in pairs],
        "same_results": {
            "max_abs_param_diff": float((p_new - p_base).abs().max()),
            "params_equal": bool(torch.equal(p_new, p_base)),
            "step_metrics_equal": same_metrics,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="vla-rl")
    ap.add_argument("--method", default="real")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--base", help="the baseline checkout (its own .venv synced)")
    ap.add_argument("--cache-dir", default=str(HERE / "runs" / "cache" / "vla"))
    ap.add_argument("--override", action="append", default=[], help="a config override, e.g. --grpo.steps=3")
    ap.add_argument("--out", default=None, help="directory of vla_step_speed.json")
    ap.add_argument("--profile", default=None, help="cProfile one run of this checkout into FILE")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--params-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cache_dir = str(Path(args.cache_dir).resolve())
    if args.worker:
        return worker(args)
    if args.profile:
        args.params_out = str(Path(tempfile.mkdtemp()) / "p.pt")
        return worker(args)
    if not args.base or not (Path(args.base) / ".venv" / "bin" / "python").exists():
        sys.exit(
            f"--base={args.base}: give a baseline checkout with its own synced .venv (see the docstring)"
        )
    report = compare(args)
    print(json.dumps(report, indent=2))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "vla_step_speed.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
