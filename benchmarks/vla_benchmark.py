"""VLA measurements a comparison grid does not make: simulator vs imagination throughput, and the
SFT stage alone at several sampling temperatures.

    uv run python benchmarks/vla_benchmark.py --throughput-repeats 5 --out benchmarks/results
    uv run python benchmarks/vla_benchmark.py --sft-only --eval-episodes 40   # SFT stage + its success

Writes ``<out>/vla_throughput.json`` (or ``<out>/vla_sft.json``). Demos, SFT and WM come from the
preset's cache. Comparing methods (GRPO runs over seeds, held-out re-evaluation, the report) is
``wmrl compare SPEC`` (wmrl/grid.py; specs in benchmarks/specs/, docs/compare.md); this script's former comparison, ``--merge`` and ``--reeval`` modes were retired for it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch


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
    from world_models.vla_dynamics import instruction_ids

    over = ["--out_dir=/tmp/wmrl-vla-throughput", "--domain.imagine_input=latent"]
    over += [f"--domain.cache_dir={cache_dir}"] if cache_dir else []
    cfg = load_config(preset, over)
    cfg.tracking.progress = False
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
    words = instruction_ids([x[2] for x in o])  # the world model's view of the instructions
    goals = torch.from_numpy(np.stack([x[3] for x in o]))  # [B, 2], for a grounded world model
    g = torch.Generator().manual_seed(0)
    adapter = domain.latent_adapter.eval()

    def latent_actor():  # encodes the 64 first frames once (counted in the timing)
        return LatentActor(policy, adapter, instr, 1.0, g, first_frames=imgs)

    wm.imagine(
        imgs, sts, lambda f, s, t: policy.act(f, s, instr, 1.0, g)[2], 2, instr=words, goal=goals
    )  # warm-up
    wm.imagine(imgs, sts, latent_actor(), 2, observe="latents", instr=words, goal=goals)

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
            res = wm.imagine(
                imgs, sts, wm_actors[name], steps, success_threshold=2.0, instr=words, goal=goals
            )
            r[f"imagined_steps_per_s/{name}"] = float(res["mask"].sum()) / (time.perf_counter() - t0)
            r[f"speedup/{name}"] = r[f"imagined_steps_per_s/{name}"] / r[f"sim_steps_per_s/{name}"]
        # the same policy on the WM's latent (no frame decoded), against the same simulator figure
        t0 = time.perf_counter()
        actor = latent_actor()
        res = wm.imagine(
            imgs, sts, actor, steps, success_threshold=2.0, observe="latents", instr=words, goal=goals
        )
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
            z, context = wm.observe(imgs, sts, words)
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
            wm.score_actions(imgs, sts, actions, torch.ones(batch, steps), words, goals)
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
    from wmrl_vla.demos import cache_key
    from wmrl_vla.domain import EVAL_SEEDS
    from wmrl_vla.pipeline import _policy_fields, prepare_demos, prepare_policy
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    cfg = load_config(preset, extra).domain
    path = Path(cfg.cache_dir) / f"sft-{cache_key(_policy_fields(cfg))}.json"
    cached = path.exists()
    policy = prepare_policy(cfg, prepare_demos(cfg, progress=False), progress=False)
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="vla-tabletop")
    p.add_argument("--out", default="runs/vla-benchmark")
    p.add_argument("--sft-only", action="store_true", help="the SFT stage and its held-out success")
    p.add_argument("--eval-episodes", type=int, default=40, help="held-out episodes per task (--sft-only)")
    p.add_argument("--throughput-batch", type=int, default=64)
    p.add_argument(
        "--throughput-repeats", type=int, default=1, help="rounds of the throughput figures (medians)"
    )
    p.add_argument(
        "--throughput-threads", type=int, default=1, help="torch threads while measuring throughput"
    )
    p.add_argument("overrides", nargs="*", help="extra --a.b=value overrides of the preset (--sft-only)")
    a, extra = p.parse_known_args(argv)
    if not a.sft_only and (a.overrides or extra):
        p.error(f"unrecognised arguments {[*a.overrides, *extra]} (preset overrides apply to --sft-only)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.sft_only:
        res = {"preset": a.preset, "overrides": [*a.overrides, *extra],
               **sft_eval(a.preset, a.eval_episodes, [*a.overrides, *extra])}  # fmt: skip
        print(json.dumps(res, indent=2))
        (out / "vla_sft.json").write_text(json.dumps(res, indent=2))
        return
    report = {
        "preset": a.preset,
        "throughput": throughput(
            a.preset, a.throughput_batch, repeats=a.throughput_repeats, threads=a.throughput_threads
        ),
    }
    print(json.dumps({k: v for k, v in report["throughput"].items() if k != "rounds"}, indent=2))
    (out / "vla_throughput.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
