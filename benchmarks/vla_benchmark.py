"""VLA benchmark: `real` vs `wmrl` (and optional ablations) from the same SFT checkpoint and world
model, same budget of GRPO steps, several seeds; plus simulator vs imagination throughput.

    uv run python benchmarks/vla_benchmark.py --preset vla-tabletop --methods real wmrl --seeds 0 1 2
    uv run python benchmarks/vla_benchmark.py --throughput-only --throughput-repeats 5 --out benchmarks/results
    uv run python benchmarks/vla_benchmark.py --sft-only --eval-episodes 40   # SFT stage + its success
    uv run python benchmarks/vla_benchmark.py --merge A/vla_benchmark.json B/vla_benchmark.json --out DIR

Writes ``<out>/vla_benchmark.json`` and ``<out>/vla_benchmark.png`` (held-out success against
wall-clock and against real simulator steps); ``--throughput-only`` writes ``<out>/vla_throughput.json``.
Demos, SFT and WM come from the preset's cache, so
every run starts from the same checkpoint. Not a test: it takes as long as the runs take.

Comparing methods (across domains, resumable, on local processes or a Ray cluster, with a cached
held-out re-evaluation in place of ``--reeval``) is ``wmrl compare SPEC`` (wmrl/grid.py; README
"Comparing methods across domains"). What stays here is what a grid does not do: the simulator vs
imagination throughput (``--throughput-only``), the SFT stage alone at several temperatures
(``--sft-only``), and reading back the JSON files already committed (``--merge``, ``--reeval``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from merge_spec import split_merge_arg  # benchmarks/merge_spec.py


def throughput(
    preset: str,
    batch: int = 64,
    steps: int = 30,
    cache_dir: str | None = None,
    repeats: int = 1,
    threads: int = 1,
) -> dict:
    """Steps per second at ``batch`` rollouts in lockstep over ``steps`` steps: MuJoCo with rendering
    vs the world model imagining with frame decoding, each with a random actor (the environment
    alone) and with the SFT policy acting (sampling at T=1), plus the WM scoring action sequences in
    latent space (what ``predict`` does). Both sides start from the same ``batch`` initial states
    (train tasks of the preset), every env is built before timing, and the same policy acts on the
    same batch; a simulated episode ends at success (its remaining steps are neither run nor
    counted), an imagined one runs the whole horizon. Each of ``repeats`` rounds measures every
    figure once, side by side; the ratios are taken within a round and the medians reported.

    ``policy_latent``: the same policy imagining on the world model's latent
    (``domain.imagine_input=latent``, wmrl_vla/latent.py): the adapter distilled at build time stands
    in for the pixel encoder and no frame is decoded. ``..._with_refresh`` also counts the adapter's
    refresh that training runs after every imagined batch (decode ``LATENT_REFRESH_SAMPLES``
    latents, encode them, ``latent_refresh_steps`` distillation steps), amortised over the batch.
    The per-step costs of the pieces (``*_ms_per_batch_step``) say where imagination's time goes."""
    from wmrl.config import load_config
    from wmrl_vla.latent import LatentActor
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    over = ["--out_dir=/tmp/wmrl-vla-throughput", "--domain.imagine_input=latent"]
    over += [f"--domain.cache_dir={cache_dir}"] if cache_dir else []
    cfg = load_config(preset, over)
    cfg.domain.progress = False
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    domain = cfg.domain.build(cfg)  # distills the latent adapter (fit figures below)
    fit = {k: float(v) for k, v in domain.step_metrics().items() if k.startswith("latent/")}
    policy = domain.policy.eval()
    wm = domain.world_model.model.eval()
    a_dim = policy.cfg.action_dim
    tasks = domain.sample_tasks(batch, "train", torch.Generator().manual_seed(0))
    split = tasks[0].env_split
    specs = [(t.task_id, t.seed) for t in tasks]
    pool = EnvPool(cfg.domain.image_size, max_steps=steps)
    o = [domain._initial_obs(t) for t in tasks]
    imgs = torch.from_numpy(np.stack([x[0] for x in o]))
    sts = torch.from_numpy(np.stack([x[1] for x in o]))
    instr = policy.tokenizer.encode([x[2] for x in o])
    g = torch.Generator().manual_seed(0)
    adapter = domain.latent_adapter.eval()

    def latent_actor():  # encodes the 64 first frames once (counted in the timing)
        return LatentActor(policy, adapter, instr, 1.0, g, first_frames=imgs)

    wm.imagine(imgs, sts, lambda f, s, t: policy.act(f, s, instr, 1.0, g)[2], 2)  # warm-up
    wm.imagine(imgs, sts, latent_actor(), 2, observe="latents")

    def random_actor(images, states, instructions):
        a = torch.rand(images.shape[0], a_dim, generator=g) * 2 - 1
        return torch.zeros_like(a, dtype=torch.long), torch.zeros_like(a), a

    # build every env (model + renderer) and render through each once before timing: the first
    # round ran up to 2x slower without this
    run_episodes(random_actor, specs, pool, split)
    sim_actors = {"random": random_actor, "policy": policy_actor(policy, 1.0, g)}
    wm_actors = {
        "random": lambda f, s, t: torch.rand(f.shape[0], a_dim, generator=g) * 2 - 1,
        "policy": lambda f, s, t: policy.act(f, s, instr, 1.0, g)[2],
    }
    rounds: list[dict[str, float]] = []
    for _ in range(repeats):
        r: dict[str, float] = {}
        for name in ("random", "policy"):
            t0 = time.perf_counter()
            ro = run_episodes(sim_actors[name], specs, pool, split)
            r[f"sim_steps_per_s/{name}"] = sum(x.length for x in ro) / (time.perf_counter() - t0)
            r[f"sim_mean_length/{name}"] = float(np.mean([x.length for x in ro]))
            t0 = time.perf_counter()
            res = wm.imagine(imgs, sts, wm_actors[name], steps, success_threshold=2.0)  # full horizon
            r[f"imagined_steps_per_s/{name}"] = float(res["mask"].sum()) / (time.perf_counter() - t0)
            r[f"speedup/{name}"] = r[f"imagined_steps_per_s/{name}"] / r[f"sim_steps_per_s/{name}"]
        # the same policy on the WM's latent (no frame decoded), against the same simulator figure
        t0 = time.perf_counter()
        actor = latent_actor()
        res = wm.imagine(imgs, sts, actor, steps, success_threshold=2.0, observe="latents")
        t_imag = time.perf_counter() - t0
        n_steps = float(res["mask"].sum())
        r["imagined_steps_per_s/policy_latent"] = n_steps / t_imag
        r["speedup/policy_latent"] = r["imagined_steps_per_s/policy_latent"] / r["sim_steps_per_s/policy"]
        t0 = time.perf_counter()
        domain.refresh_latent_adapter(imgs, res["latents"], actor.f0, instr, [steps] * batch)
        adapter.eval()
        r["latent_refresh_ms_per_batch"] = 1e3 * (time.perf_counter() - t0)
        r["imagined_steps_per_s/policy_latent_with_refresh"] = n_steps / (time.perf_counter() - t0 + t_imag)
        r["speedup/policy_latent_with_refresh"] = (
            r["imagined_steps_per_s/policy_latent_with_refresh"] / r["sim_steps_per_s/policy"]
        )
        # the policy alone on the same batch, per lockstep step: what both "policy" sides pay on top
        t0 = time.perf_counter()
        for _ in range(steps):
            policy.act(imgs, sts, instr, 1.0, g)
        r["policy_ms_per_batch_step"] = 1e3 * (time.perf_counter() - t0) / steps
        # where imagination's time goes, per lockstep step of the batch: the policy on a decoded
        # frame, the WM decoding that frame, the policy on the latent (adapter + trunk)
        with torch.no_grad():
            z, context = wm.observe(imgs, sts)
            prepared = wm.decoder.prepare(*context)
            t0 = time.perf_counter()
            for _ in range(steps):
                frame = wm.sample_frame(z, context, None, prepared)
            r["wm_decode_ms_per_batch_step"] = 1e3 * (time.perf_counter() - t0) / steps
            t0 = time.perf_counter()
            for _ in range(steps):
                policy.act(frame, sts, instr, 1.0, g)
            r["policy_on_decoded_ms_per_batch_step"] = 1e3 * (time.perf_counter() - t0) / steps
            actor = latent_actor()
            actor(z, sts, 0)
            t0 = time.perf_counter()
            for t in range(1, steps + 1):
                actor(z, sts, t)
            r["policy_latent_ms_per_batch_step"] = 1e3 * (time.perf_counter() - t0) / steps
        # scoring only: latent rollout of every action sequence with every member, no decoding
        actions = torch.rand(batch, steps, a_dim, generator=g) * 2 - 1
        t0 = time.perf_counter()
        with torch.no_grad():
            wm.score_actions(imgs, sts, actions, torch.ones(batch, steps))
        r["wm_scored_steps_per_s"] = batch * steps / (time.perf_counter() - t0)
        r["speedup/scoring_vs_sim"] = r["wm_scored_steps_per_s"] / r["sim_steps_per_s/random"]
        rounds.append(r)
    pool.close()
    domain.close()
    torch.set_num_threads(prev_threads)
    out: dict = {"batch": batch, "horizon": steps, "threads": threads, "repeats": repeats}
    out.update({k: float(np.median([r[k] for r in rounds])) for k in rounds[0]})
    out["latent_adapter_fit"] = fit
    out["rounds"] = rounds
    return out


def sft_eval(preset: str, episodes: int, extra: list[str], temperatures=(0.0, 1.0)) -> dict:
    """Build (or load from the cache) the preset's SFT policy and measure its held-out success as
    ``VLADomain.evaluate`` does: ``episodes`` per task, seeds ``EVAL_SEEDS[0] + 7919 k``, "test"
    instruction/colour combinations, at each sampling temperature (0 = greedy)."""
    from wmrl.config import load_config
    from wmrl_vla.domain import EVAL_SEEDS
    from wmrl_vla.pipeline import _key, _policy_fields, prepare_demos, prepare_policy
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    cfg = load_config(preset, extra).domain
    cfg.progress = False
    path = Path(cfg.cache_dir) / f"sft-{_key(_policy_fields(cfg))}.json"
    cached = path.exists()
    policy = prepare_policy(cfg, prepare_demos(cfg))
    hist = json.loads(path.read_text())
    out: dict = {"checkpoint": str(path.with_suffix(".pt")), "cached": cached, "sft_seconds": hist["seconds"],
                 "episodes_per_task": episodes, "train_token_accuracy": hist["accuracy"][-1]}  # fmt: skip
    pool = EnvPool(cfg.image_size, cfg.max_steps)
    specs = [(t, EVAL_SEEDS[0] + 7919 * k) for t in cfg.tasks for k in range(episodes)]
    for temp in temperatures:
        ro = run_episodes(
            policy_actor(policy, temp, torch.Generator().manual_seed(12345)), specs, pool, "test"
        )
        res = {"success": float(np.mean([r.success.max() for r in ro])),
               "reward": float(np.mean([r.reward for r in ro]))}  # fmt: skip
        for t in cfg.tasks:
            res[f"success/{t.split('/')[-1]}"] = float(
                np.mean([r.success.max() for r in ro if r.task_id == t])
            )
        out[f"T={temp:g}"] = res
    pool.close()
    return out


def reeval(run_dirs: list[Path], episodes: int) -> dict:
    """Re-evaluate finished runs' final policies (``checkpoints/latest.pt``) on ``episodes`` held-out
    episodes per task, and the SFT policy they started from on the same episodes, as
    ``VLADomain.evaluate`` does (greedy as the preset; the run's own evaluation used the first
    ``eval_episodes_per_task`` of these seeds). More episodes than a run can afford at every
    evaluation: the error of one evaluation of 40 episodes per task (about 5 points) is most of the
    seed-to-seed spread. Runs are grouped as ``<benchmark folder>/<method>``."""
    from wmrl.config import load_config
    from wmrl.tracking import safe_load

    per_run: dict = {}
    sft: dict | None = None
    for d in run_dirs:
        with tempfile.TemporaryDirectory(prefix="wmrl-reeval-") as tmp:  # the domain's own output
            over = [
                f"--out_dir={tmp}",
                f"--domain.eval_episodes_per_task={episodes}",
                "--domain.n_videos=0",
            ]
            cfg = load_config(d / "config.yaml", over)
            cfg.domain.progress = False
            domain = cfg.domain.build(cfg)
            if sft is None:
                sft = {k: v for k, v in domain.evaluate().items() if not k.endswith("_train")}
            state = safe_load(d / "checkpoints" / "latest.pt")
            domain.policy.load_state_dict(state["policy"])
            res = {k: v for k, v in domain.evaluate().items() if not k.endswith("_train")}
            per_run[str(d)] = {"group": f"{d.parent.parent.name}/{d.parent.name}", "seed": cfg.seed,
                               "step": state.get("step"), **res}  # fmt: skip
            domain.close()
        print(f"{d}: success {res['success']:.3f} (SFT {sft['success']:.3f})", flush=True)
    groups: dict = {}
    for r in per_run.values():
        groups.setdefault(r["group"], []).append(r["success"])
    summary = {
        g: {"n": len(v), "success": float(np.mean(v)),
            "se": float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None, "per_seed": v}
        for g, v in groups.items()
    }  # fmt: skip
    return {"episodes_per_task": episodes, "sft": sft, "summary": summary, "runs": per_run}


def run_method(preset: str, method: str, seed: int, out: Path, extra: list[str]) -> dict:
    from wmrl.config import load_config
    from wmrl.tracking import read_metrics
    from wmrl.trainer import Trainer

    run_dir = out / method / f"seed{seed}"
    cfg = load_config(preset, [f"--method={method}", f"--seed={seed}", f"--out_dir={run_dir}", *extra])
    domain = cfg.domain.build(cfg)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, domain)
    if cfg.tracking.eval_every <= 0:  # the trainer evaluates the SFT policy itself when eval_every > 0
        trainer.logger.log(0, trainer.evaluate())
    trainer.train()
    wall = time.perf_counter() - t0
    domain.close()
    rows = read_metrics(run_dir)
    clock, curve = 0.0, []
    for r in rows:
        clock += r.get("time/step", 0.0)
        if "eval/success" in r:
            curve.append(
                {
                    "step": r["step"],
                    "wall_clock_s": clock,
                    "sim_steps": r.get("eval/sim_steps_train", 0.0),
                    "real_rollouts": r.get("exec/real_total", 0.0),
                    "success": r["eval/success"],
                    "reward": r["eval/reward"],
                }
            )
    phases = {
        k: float(np.mean([r[k] for r in rows if k in r]))
        for k in {k for r in rows for k in r if k.startswith("time/")}
    }
    return {"curve": curve, "wall_s": wall, "time_per_step": phases}


def summarise(results: dict) -> dict:
    """Per method: SFT and final held-out success/reward (mean, standard error, per seed), real sim
    steps and wall-clock (means); for every method but ``real``, its paired gap to ``real``
    (``real - method`` over the seeds both ran) and ``real``'s sim steps per its own; for ``ppi`` and
    ``wmrl``, the paired difference to ``anchors_only`` (the same anchors without the WM)."""
    summary: dict = {}
    for m, runs in results.items():
        finals = [r["curve"][-1] for r in runs.values()]
        success = np.array([f["success"] for f in finals])
        summary[m] = {
            "seeds": list(runs),
            "sft_success": float(np.mean([r["curve"][0]["success"] for r in runs.values()])),
            "final_success": float(success.mean()),
            "final_success_se": float(success.std(ddof=1) / np.sqrt(len(success)))
            if len(success) > 1
            else None,
            "final_success_per_seed": success.tolist(),
            "sft_reward": float(np.mean([r["curve"][0]["reward"] for r in runs.values()])),
            "final_reward": float(np.mean([f["reward"] for f in finals])),
            "sim_steps": float(np.mean([f["sim_steps"] for f in finals])),
            "wall_clock_s": float(np.mean([f["wall_clock_s"] for f in finals])),
        }
    for m in [m for m in results if m != "real" and "real" in results]:
        both = [s for s in results[m] if s in results["real"]]
        gap = np.array(
            [results["real"][s]["curve"][-1]["success"] - results[m][s]["curve"][-1]["success"] for s in both]
        )
        if len(gap) > 1:
            summary[m]["paired_gap_to_real"] = float(gap.mean())
            summary[m]["paired_gap_to_real_se"] = float(gap.std(ddof=1) / np.sqrt(len(gap)))
        summary[m]["sim_steps_fewer_than_real"] = summary["real"]["sim_steps"] / max(
            summary[m]["sim_steps"], 1.0
        )
    for m, base in (
        ("ppi", "anchors_only"),
        ("wmrl", "anchors_only"),
    ):  # same anchors, with vs without the WM
        both = [s for s in results.get(m, {}) if s in results.get(base, {})]
        diff = np.array(
            [results[m][s]["curve"][-1]["success"] - results[base][s]["curve"][-1]["success"] for s in both]
        )
        if len(diff) > 1:
            summary[m][f"paired_minus_{base}"] = float(diff.mean())
            summary[m][f"paired_minus_{base}_se"] = float(diff.std(ddof=1) / np.sqrt(len(diff)))
    return summary


def merge(paths: list[str], out: Path) -> dict:
    """Combine the runs of several ``vla_benchmark.json`` files (disjoint seeds, same preset and
    overrides) into ``<out>/vla_benchmark_merged.{json,png}``."""
    results: dict = {}
    sources = []
    for spec in paths:
        p, keep = split_merge_arg(str(spec))
        d = json.loads(p.read_text())
        sources.append({"file": str(spec), "preset": d.get("preset"), "overrides": d.get("overrides")})
        for m, runs in d["runs"].items():
            if keep is not None and m not in keep:
                continue
            clash = set(runs) & set(results.get(m, {}))
            if clash:
                raise SystemExit(f"{p}: {m} runs {sorted(clash)} are already in an earlier file")
            results.setdefault(m, {}).update(runs)
    report = {"sources": sources, "runs": results, "summary": summarise(results)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "vla_benchmark_merged.json").write_text(json.dumps(report, indent=2))
    plot(results, out / "vla_benchmark_merged.png")
    return report


def plot(results: dict, path: Path) -> None:
    """Held-out success (top) and reward (bottom) against wall-clock and against real sim steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex="col")
    for method, runs in results.items():
        curves = [r["curve"] for r in runs.values()]
        n = min(len(c) for c in curves)
        for row, metric in enumerate(("success", "reward")):
            y = np.array([[p[metric] for p in c[:n]] for c in curves])
            for col, key in enumerate(("wall_clock_s", "sim_steps")):
                ax = axes[row, col]
                x = np.mean([[p[key] for p in c[:n]] for c in curves], 0)
                ax.plot(x, y.mean(0), marker="o", label=f"{method} (n={len(curves)})")
                ax.fill_between(x, y.min(0), y.max(0), alpha=0.15)
                ax.set_ylabel(f"held-out {metric}")
                ax.grid(alpha=0.3)
                ax.legend()
    axes[1, 0].set_xlabel("training wall-clock (s)")
    axes[1, 1].set_xlabel("real simulator steps (training)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="vla-tabletop")
    p.add_argument("--methods", nargs="+", default=["real", "wmrl"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default="runs/vla-benchmark")
    p.add_argument("--throughput-only", action="store_true")
    p.add_argument("--sft-only", action="store_true", help="only the SFT stage and its held-out success")
    p.add_argument(
        "--eval-episodes", type=int, default=40, help="held-out episodes per task (--sft-only, --reeval)"
    )
    p.add_argument("--throughput-batch", type=int, default=64)
    p.add_argument(
        "--throughput-repeats", type=int, default=1, help="rounds of the throughput figures (medians)"
    )
    p.add_argument(
        "--throughput-threads", type=int, default=1, help="torch threads while measuring throughput"
    )
    p.add_argument("--no-throughput", action="store_true", help="only the GRPO runs (no throughput figures)")
    p.add_argument("--plot-only", metavar="JSON", help="redraw the plot of an existing vla_benchmark.json")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON[:METHODS]",
        help="combine vla_benchmark.json files of other seeds or methods; `FILE:real,wmrl` takes "
        "only those methods from FILE",
    )
    p.add_argument("overrides", nargs="*", help="extra --a.b=value overrides for every run")
    p.add_argument(
        "--reeval",
        nargs="+",
        metavar="RUN_DIR",
        help="re-evaluate these finished runs' final policies and their SFT policy on "
        "--eval-episodes held-out episodes per task; writes <out>/vla_reeval.json",
    )
    p.add_argument(
        "--label",
        help="report the (single) method under this name, e.g. `real_quarter` for `--methods real "
        "--grpo.tasks_per_step=1`: GRPO on as many simulator steps as wmrl's anchors",
    )
    a, extra = p.parse_known_args(argv)
    if a.label and len(a.methods) != 1:
        p.error(f"--label names one method; got --methods {' '.join(a.methods)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.reeval:
        torch.set_num_threads(1)
        res = reeval([Path(d) for d in a.reeval], a.eval_episodes)
        print(json.dumps(res["summary"], indent=2))
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "vla_reeval.json").write_text(json.dumps(res, indent=2))
        return
    if a.merge:
        print(json.dumps(merge(a.merge, Path(a.out))["summary"], indent=2))
        return
    if a.plot_only:
        src = Path(a.plot_only)
        plot(json.loads(src.read_text())["runs"], src.with_suffix(".png"))
        return
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.sft_only:
        res = {"preset": a.preset, "overrides": [*a.overrides, *extra],
               **sft_eval(a.preset, a.eval_episodes, [*a.overrides, *extra])}  # fmt: skip
        print(json.dumps(res, indent=2))
        (out / "vla_sft.json").write_text(json.dumps(res, indent=2))
        return
    extra = [*a.overrides, *extra, "--tracking.progress=false"]
    report: dict = {"preset": a.preset, "overrides": extra}
    if not a.no_throughput:
        report["throughput"] = throughput(
            a.preset, a.throughput_batch, repeats=a.throughput_repeats, threads=a.throughput_threads
        )
        print(json.dumps({k: v for k, v in report["throughput"].items() if k != "rounds"}, indent=2))
    if a.throughput_only:  # its own file: vla_benchmark.json holds the GRPO runs
        (out / "vla_throughput.json").write_text(json.dumps(report, indent=2))
        return
    results: dict = {}
    for m in a.methods:
        for s in a.seeds:
            results.setdefault(a.label or m, {})[f"seed{s}"] = run_method(a.preset, m, s, out, extra)
            (out / "vla_benchmark.json").write_text(json.dumps({**report, "runs": results}, indent=2))
    report["runs"] = results
    report["summary"] = summarise(results)
    plot(results, out / "vla_benchmark.png")
    print(json.dumps(report["summary"], indent=2))
    (out / "vla_benchmark.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
