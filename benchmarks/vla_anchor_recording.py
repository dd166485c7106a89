"""What recording anchor rollouts to a LeRobot dataset costs a VLA step, and where it should run.

A WM method's step appends its anchor rollouts to the run's LeRobot dataset (``--domain.record_anchors``)
while the WM trains on them. This measures, on synthetic episodes shaped like ``vla-rl``'s (64 px frames,
50 steps):

- ``seconds_per_episode``: the write's own cost (``wmrl_vla.data.append_episodes``), from writes of
  1, 8 and 32 episodes (least squares: fixed + per-episode);
- the training it slows: ``--loop-steps`` steps of a small conv net's forward and backward, timed
  alone, with one step's anchors (``--episodes``) written in a thread beside it (the old way), and in a
  process of its own (``wmrl_vla.world_model.AnchorRecorder``, the new way), in alternating order over
  ``--pairs`` pairs. Only ratios measured side by side mean anything on a shared machine: the
  figures are the medians of (thread / alone) and (process / alone) and (thread / process).

    uv run python benchmarks/vla_anchor_recording.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

CONTROL_NOTE = "a measurement of where a file is written, not of a method: no WM claim rests on it"


def episodes(n: int, length: int, rng: np.random.Generator) -> list[list[tuple]]:
    """``n`` synthetic episodes of ``length`` transitions and a final observation (append_episodes' frames)."""

    def obs() -> dict:
        return {
            "image": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
            "state": rng.normal(size=9).astype(np.float32),
        }

    instr = "press the red button"
    return [
        [(obs(), rng.normal(size=4).astype(np.float32), 0.1, False, instr) for _ in range(length)]
        + [(obs(), None, None, None, instr)]
        for _ in range(n)
    ]


def write_cost(root: Path, rng: np.random.Generator, length: int) -> dict:
    from wmrl_vla.data import append_episodes

    append_episodes(root, "bench/anchors", episodes(1, length, rng))  # create the dataset first
    sizes, secs = [], []
    for n in (1, 8, 32):
        eps = episodes(n, length, rng)
        t0 = time.perf_counter()
        append_episodes(root, "bench/anchors", eps)
        sizes.append(n)
        secs.append(time.perf_counter() - t0)
    per_episode, fixed = np.polyfit(sizes, secs, 1)
    return {"episodes": sizes, "seconds": secs, "seconds_per_episode": per_episode, "seconds_fixed": fixed}


def training_loop(steps: int) -> float:
    """Seconds for ``steps`` forward/backward/Adam steps of a small conv net on 64 px frames."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5, stride=2), torch.nn.GELU(), torch.nn.Conv2d(32, 64, 5, stride=2),
        torch.nn.GELU(), torch.nn.Flatten(), torch.nn.LazyLinear(64),
    )  # fmt: skip
    x = torch.randn(64, 3, 64, 64)
    net(x)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def timed(way: str, args, rng: np.random.Generator, root: Path, process_pool) -> float:
    """The training loop's seconds with one step's anchors written ``way``: not at all (``alone``), in
    a thread, or in ``process_pool`` (a spawned one-worker pool, as ``AnchorRecorder`` keeps)."""
    from wmrl_vla.data import append_episodes

    if way == "alone":
        return training_loop(args.loop_steps)
    eps = episodes(args.episodes, args.length, rng)
    with ThreadPoolExecutor(max_workers=1) as thread_pool:
        pool = thread_pool if way == "thread" else process_pool
        job = pool.submit(append_episodes, root / way, "bench/anchors", eps)
        secs = training_loop(args.loop_steps)
        job.result()
    return secs


def spawned_pool():
    """:class:`wmrl_vla.world_model.AnchorRecorder`'s pool (:func:`~wmrl_vla.world_model.recording_pool`),
    with lerobot imported there before anything is timed (a run pays that once)."""
    from wmrl_vla.world_model import recording_pool

    pool = recording_pool()
    pool.submit(_import_data).result()
    return pool


def _import_data() -> None:
    import wmrl_vla.data  # noqa: F401


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=8, help="anchor episodes per step (vla-rl: 1 group of 8)")
    p.add_argument("--length", type=int, default=50, help="transitions per episode")
    p.add_argument("--loop-steps", type=int, default=40, help="training steps timed per measurement")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="wmrl-anchor-recording-"))
    result: dict = {
        "command": "benchmarks/vla_anchor_recording.py",
        "args": vars(args),
        "control": CONTROL_NOTE,
    }
    result["write"] = write_cost(root / "cost", rng, args.length)
    print(f"write: {result['write']['seconds_per_episode']:.3f} s per episode", flush=True)
    ways = ["alone", "thread", "process"]
    rows = []
    process_pool = spawned_pool()
    try:
        for k in range(args.pairs):
            order = ways if k % 2 == 0 else ways[::-1]
            row = {w: timed(w, args, rng, root / f"pair{k}", process_pool) for w in order}
            print(f"pair {k}: " + ", ".join(f"{w} {s:.2f} s" for w, s in row.items()), flush=True)
            rows.append(row)
    finally:
        process_pool.shutdown()
    result["pairs"] = rows
    result["ratio_median"] = {
        "thread/alone": statistics.median(r["thread"] / r["alone"] for r in rows),
        "process/alone": statistics.median(r["process"] / r["alone"] for r in rows),
        "thread/process": statistics.median(r["thread"] / r["process"] for r in rows),
    }
    print(json.dumps(result["ratio_median"], indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vla_anchor_recording.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
