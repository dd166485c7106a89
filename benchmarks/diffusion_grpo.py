"""Does GRPO through the denoising chain's log-probability improve a diffusion policy? (docs/diffusion.md)

Per seed:

1. record the task's scripted-expert demos (the VLA domain's ``run_expert_episodes``);
2. clone a small lerobot DiffusionPolicy on them with lerobot's diffusion loss
   (:func:`wmrl_vla.diffusion_bridge.train_bc`);
3. evaluate it on held-out seeds: success *before*, with the chain sampled (temperature 1, the policy
   GRPO trains) and as its chain of means (temperature 0);
4. post-train it with GRPO on real simulator rollouts only (the ``real`` method's data: no world
   model): group-relative advantages (:func:`wmrl.learner.group_advantages`) and the core's clipped
   token loss (:func:`wmrl.learner.clipped_policy_loss`) on the recorded chains' log-probs
   (:meth:`wmrl_vla.diffusion_bridge.DiffusionChainPolicy.log_probs`);
5. evaluate again on the same held-out seeds: success *after*.

``--act-steps k`` (DPPO's ``act_steps``) executes the first ``k`` actions of each sampled chunk open
loop, in evaluation and in GRPO alike: one decision (a chain, its log-prob scored over the ``k``
executed positions) per ``k`` environment steps; 1 (the default) re-plans every step.
``--ft-denoising-steps K'`` (DPPO's ``ft_denoising_steps``) fine-tunes only the chain's last ``K'``
steps: the first ``K - K'`` run by a frozen copy of the cloned policy and leave the log-prob.

    for s in 0 1 2; do uv run python benchmarks/diffusion_grpo.py --seeds $s; done

(one seed per process bounds memory; each appends its run to the JSON, replacing an earlier run of
that seed)

``--pool JSON...`` runs nothing: it prints the pooled paired summary of result files (one seed each;
gained/lost episodes, the sign test, a 95% interval) for the final evaluation and each ``--eval-at``,
with the one-sided t-test of the mean per-seed gain (``per_seed``: ``diffusion_confirm``'s primary
endpoint); ``--plot PNG`` also draws the per-seed gains at each evaluation.

Writes ``<out>/diffusion_grpo.json`` (every figure, per seed, with the settings). A benchmark, not a
test: a few seeds and a small budget; the held-out successes carry the binomial noise of
``--eval-episodes`` episodes, and the paired before/after difference is reported per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch

EVAL_SEED0 = 1_000_000  # held-out episode seeds (the domain's EVAL_SEEDS start)


def evaluate(policy, task: str, pool, episodes: int, temperature: float, lockstep: int) -> dict:
    """Held-out success (per episode too, for the paired before/after test) and reward of ``policy`` at
    ``temperature`` (its noise seeded alike every call)."""
    from wmrl_vla.rollout import policy_actor, run_in_lockstep

    actor = policy_actor(policy, temperature, torch.Generator().manual_seed(12345))
    rs = run_in_lockstep(actor, [(task, EVAL_SEED0 + k) for k in range(episodes)], pool, "test", lockstep)
    per_episode = [bool(r.success.max() > 0) for r in rs]
    return {
        "success": float(np.mean(per_episode)),
        "reward": float(np.mean([r.reward for r in rs])),
        "per_episode": per_episode,
    }


def pooled_paired(after: list[list[bool]], before: list[list[bool]]) -> dict:
    """Per-seed episodes ``after[i]``, ``before[i]`` (the same held-out episodes, same order) pooled:
    ``paired`` over the concatenation (gained ``n10``, lost ``n01``, the sign test = McNemar's exact p)
    and the Wald 95% interval of the paired difference ``d = (n10 - n01) / n``:
    ``d ± 1.96 sqrt(((n10 + n01) / n - d²) / n)``, ``n`` the pooled episodes."""
    from act_chunk_start import paired  # benchmarks/ is the script's folder

    if len(after) != len(before) or not after:
        raise ValueError(f"pooling needs the same seeds before and after: {len(after)} and {len(before)}")
    pr = paired([e for x in after for e in x], [e for y in before for e in y])
    n, d = sum(len(x) for x in after), pr["difference"]
    half = 1.96 * float(np.sqrt(((pr["n10"] + pr["n01"]) / n - d * d) / n))
    return {**pr, "episodes": n, "ci95_wald": [d - half, d + half]}


def gains(after: list[list[bool]], before: list[list[bool]]) -> list[float]:
    """Each seed's gain in success, ``mean(after[i]) - mean(before[i])``."""
    return [float(np.mean(a) - np.mean(b)) for a, b in zip(after, before, strict=True)]


def seed_mean_test(per_seed: list[float]) -> dict:
    """The one-sample t-test of the mean per-seed gain (``diffusion_confirm``'s primary endpoint):
    ``t = mean(g) / (sd(g) / sqrt(n))`` over the ``n`` seeds' gains ``g`` (sd with n - 1), its
    one-sided p for H1 mean > 0 on n - 1 degrees of freedom, and the one-sided 95% lower bound
    ``mean - t_{0.95, n-1} sd / sqrt(n)``."""
    from scipy import stats

    g = np.asarray(per_seed, dtype=float)
    if g.size < 2:
        raise ValueError(f"the t-test of the per-seed gains needs at least 2 seeds, got {g.size}")
    mean, sd = float(g.mean()), float(g.std(ddof=1))
    se = sd / np.sqrt(g.size)
    t = mean / se
    return {
        "seeds": int(g.size), "mean_gain": mean, "sd": sd, "t": float(t),
        "p_one_sided": float(stats.t.sf(t, g.size - 1)),
        "lower_bound_95": float(mean - stats.t.ppf(0.95, g.size - 1) * se),
        "seeds_with_gain": int((g > 0).sum()), "gains": g.tolist(),
    }  # fmt: skip


def pool_results(paths: list[str], temperature: str = "t1") -> dict:
    """``pooled_paired`` of the final evaluation and of every ``--eval-at`` step the result JSONs
    ``paths`` (one run each, ``diffusion_grpo.json`` of one seed) all have, against their ``before``,
    each with ``seed_mean_test`` of the per-seed gains in success (with one seed, none)."""
    runs = [r for p in paths for r in json.loads(Path(p).read_text())["runs"]]
    before = [r["before"][temperature]["per_episode"] for r in runs]
    afters = {"final": [r["after"][temperature]["per_episode"] for r in runs]}
    for n in sorted(set.intersection(*(set(r["after_steps"]) for r in runs)), key=int):
        afters[f"after_{n}_steps"] = [r["after_steps"][n][temperature]["per_episode"] for r in runs]
    steps = {int(r["settings"]["grpo_steps"]) for r in runs}
    return {
        "seeds": [r["seed"] for r in runs],
        "final_step": steps.pop() if len(steps) == 1 else None,
        "before_success": float(np.mean([e for x in before for e in x])),
        **{k: {"success": float(np.mean([e for x in v for e in x])), **pooled_paired(v, before),
               "per_seed": seed_mean_test(gains(v, before)) if len(runs) > 1 else None}
           for k, v in afters.items()},
    }  # fmt: skip


def plot_pool(pooled: dict, path: Path) -> Path:
    """``pool_results``' per-seed gains (points) at each evaluation, GRPO steps on x, with their mean
    and its two-sided 95% t interval, ``mean ± t_{0.975, n-1} sd / sqrt(n)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    keys = [k for k in pooled if k.startswith("after_")] + ["final"]
    xs = [int(k.split("_")[1]) if k != "final" else pooled["final_step"] for k in keys]
    per = [pooled[k]["per_seed"] for k in keys]
    if None in per or None in xs:
        raise ValueError("plotting needs two or more seeds run with the same --grpo-steps")
    fig, ax = plt.subplots(figsize=(6, 3.8))
    points = np.array([p["gains"] for p in per]) * 100  # (evaluations, seeds)
    ax.plot(xs, points, color="0.75", lw=0.8, marker="o", ms=3, zorder=1)
    mean = points.mean(axis=1)
    half = stats.t.ppf(0.975, points.shape[1] - 1) * points.std(axis=1, ddof=1) / np.sqrt(points.shape[1])
    ax.errorbar(xs, mean, yerr=half, color="C0", lw=2, capsize=4, marker="s", label="mean, 95% t interval")
    ax.axhline(0, color="k", lw=0.8)
    ax.set(
        xlabel="GRPO steps",
        ylabel="held-out success gain (points)",
        xticks=xs,
        title=f"{len(pooled['seeds'])} seeds (grey: each seed), before {100 * pooled['before_success']:.1f}%",
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def grpo_step(policy, opt, task: str, pool, a: argparse.Namespace, gen: torch.Generator, step: int) -> dict:
    """One GRPO step: ``groups`` training seeds x ``group_size`` sampled rollouts, then ``epochs``
    passes of the clipped-ratio loss over minibatches of whole groups."""
    from wmrl.learner import clipped_policy_loss, group_advantages
    from wmrl_vla.batch import collate, sim_payload
    from wmrl_vla.rollout import policy_actor, run_in_lockstep

    seeds = torch.randint(0, EVAL_SEED0, (a.groups,), generator=gen).tolist()
    specs = [(task, s) for s in seeds for _ in range(a.group_size)]
    policy.eval()
    rs = run_in_lockstep(policy_actor(policy, 1.0, gen), specs, pool, "train", a.lockstep)
    rewards = torch.tensor([r.reward for r in rs])
    adv, _ = group_advantages(rewards, torch.arange(a.groups).repeat_interleave(a.group_size))
    payloads = [sim_payload(r) for r in rs]
    policy.train()
    stats = []
    per_mb = max(1, a.minibatch_groups)
    for _ in range(a.epochs):
        for g0 in range(0, a.groups, per_mb):
            rows = slice(g0 * a.group_size, min(a.groups, g0 + per_mb) * a.group_size)
            tasks = seeds[g0 : g0 + per_mb]
            batch = collate(payloads[rows], tasks, a.group_size, a.image_size, policy.tokenizer)
            logp = policy.log_probs(batch)
            loss, st = clipped_policy_loss(logp, batch.logprobs, adv[rows], batch.mask, a.clip_eps)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), a.max_grad_norm)
            opt.step()
            stats.append({k: float(v) for k, v in st.items()})
    return {
        "step": step,
        "train_success": float(np.mean([r.success.max() for r in rs])),
        "train_reward": float(rewards.mean()),
        "clip_frac": float(np.mean([s["clip_frac"] for s in stats])),
        "approx_kl": float(np.mean([s["approx_kl"] for s in stats])),
    }


def run_seed(seed: int, a: argparse.Namespace) -> dict:
    from act_chunk_start import paired  # benchmarks/ is the script's folder

    import sims
    from wmrl_vla.diffusion_bridge import DiffusionBridgeConfig, DiffusionChainPolicy, train_bc
    from wmrl_vla.rollout import EnvPool, run_expert_episodes

    t0 = time.perf_counter()
    spec = sims.task_info(a.task)
    pool = EnvPool(a.image_size)
    torch.manual_seed(seed)
    demos = run_expert_episodes([(a.task, 10_000 * seed + i) for i in range(a.demos)], pool, "train")
    records = [d.as_record() for d in demos]
    policy = DiffusionChainPolicy.from_config(
        DiffusionBridgeConfig(
            image_size=a.image_size, state_dim=spec["state_dim"], action_dim=spec["action_dim"],
            use_image=a.use_image, horizon=a.horizon, chain_steps=a.chain_steps, min_std=a.min_std,
            chain_scoring=a.chain_scoring, act_steps=a.act_steps, ft_denoising_steps=a.ft_denoising_steps,
        )
    )  # fmt: skip
    bc = train_bc(policy, records, a.bc_steps, lr=a.bc_lr, seed=seed)
    t_bc = time.perf_counter() - t0
    temps = [float(t) for t in a.eval_temperatures.split(",")]
    before = {f"t{t:g}": evaluate(policy, a.task, pool, a.eval_episodes, t, a.lockstep) for t in temps}
    rates = {k: v["success"] for k, v in before.items()}
    print(f"[seed {seed}] BC loss {bc[-1]:.4f}; success before {rates} ({t_bc:.0f}s)", flush=True)
    # the fine-tuned parameters (not the frozen base of --ft-denoising-steps)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 777)
    steps, during = [], {}
    eval_at = {int(n) for n in a.eval_at.split(",") if n} & set(range(1, a.grpo_steps))
    for k in range(a.grpo_steps):
        steps.append(grpo_step(policy, opt, a.task, pool, a, gen, k))
        print(f"[seed {seed}] {steps[-1]}", flush=True)
        if k + 1 in eval_at:  # its own noise generator: the training draws are unchanged
            ev = {f"t{t:g}": evaluate(policy, a.task, pool, a.eval_episodes, t, a.lockstep) for t in temps}
            during[k + 1] = {
                **ev,
                **{f"paired_{t}": paired(ev[t]["per_episode"], before[t]["per_episode"]) for t in ev},
            }
            rates = {t: v["success"] for t, v in ev.items()}
            print(f"[seed {seed}] success after {k + 1} steps {rates}", flush=True)
    after = {f"t{t:g}": evaluate(policy, a.task, pool, a.eval_episodes, t, a.lockstep) for t in temps}
    pool.close()
    out = {
        "seed": seed,
        "expert_demo_success": float(np.mean([d.success.max() for d in demos])),
        "bc_loss_last": bc[-1],
        "before": before,
        "after": after,
        **{f"gain_success_{k}": after[k]["success"] - before[k]["success"] for k in before},
        # the same held-out episodes before and after: discordant pairs and McNemar's exact p
        **{f"paired_{k}": paired(after[k]["per_episode"], before[k]["per_episode"]) for k in before},
        "grpo": steps,
        "after_steps": during,  # held-out evaluations after these GRPO steps (--eval-at)
        "seconds": time.perf_counter() - t0,
    }
    rates = {k: v["success"] for k, v in after.items()}
    print(f"[seed {seed}] success after {rates} ({out['seconds']:.0f}s)", flush=True)
    return out


def main() -> None:
    from wmrl_vla.denoising_chain import CHAIN_SCORINGS
    from wmrl_vla.diffusion_bridge import DiffusionBridgeConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/diffusion_grpo")
    p.add_argument("--task", default="wmrl/DMC-reacher-easy-v0")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--use-image", action="store_true", help="condition on the camera too (default: state)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--demos", type=int, default=20)
    p.add_argument("--horizon", type=int, default=4)
    p.add_argument("--chain-steps", type=int, default=8)
    p.add_argument("--min-std", type=float, default=0.1)
    p.add_argument(
        "--chain-scoring", choices=CHAIN_SCORINGS, default=DiffusionBridgeConfig.chain_scoring,
        help="the chain terms a token scores: joint (all), executed_marginal (exact marginal of the "
        "executed action), executed_only (DPPO's heuristic, biased)",
    )  # fmt: skip
    p.add_argument(
        "--act-steps", type=int, default=DiffusionBridgeConfig.act_steps,
        help="chunk positions executed open loop per sampled chain, one GRPO decision each (1: closed "
        "loop; DPPO's act_steps, at most --horizon)",
    )  # fmt: skip
    p.add_argument(
        "--ft-denoising-steps", type=int, default=DiffusionBridgeConfig.ft_denoising_steps,
        help="fine-tune only the chain's last K' denoising steps, the first K - K' from a frozen copy of "
        "the cloned policy (DPPO's ft_denoising_steps; default: all --chain-steps)",
    )  # fmt: skip
    p.add_argument("--bc-steps", type=int, default=1500)
    p.add_argument("--bc-lr", type=float, default=1e-3)
    p.add_argument("--grpo-steps", type=int, default=8)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--minibatch-groups", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--eval-at", default="", help="also evaluate after these GRPO steps (comma list)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lockstep", type=int, default=16, help="envs stepped at once (memory)")
    p.add_argument(
        "--eval-temperatures", default="1,0", help="1: the sampled chain GRPO trains; 0: its means"
    )
    p.add_argument(
        "--pool", nargs="+", metavar="JSON",
        help="print the pooled paired summary of these result files (one seed each) and exit; runs nothing",
    )  # fmt: skip
    p.add_argument("--plot", metavar="PNG", help="with --pool: also plot the per-seed gains to this file")
    a = p.parse_args()
    if a.pool:
        pooled = pool_results(a.pool)
        print(json.dumps(pooled, indent=2))
        if a.plot:
            plot_pool(pooled, Path(a.plot))
        return
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "diffusion_grpo.json"
    # seeds already in the file (earlier processes, one seed each to bound memory) are kept
    result: dict = json.loads(path.read_text()) if path.exists() else {"runs": []}
    for s in [int(x) for x in a.seeds.split(",")]:
        run = {"settings": vars(a), "command": " ".join(["python", *sys.argv]), **run_seed(s, a)}
        result["runs"] = [r for r in result["runs"] if r["seed"] != s] + [run]
        per = result["runs"]
        keys = sorted(set.intersection(*(set(r["before"]) for r in per)))
        result["summary"] = {
            "seeds": [r["seed"] for r in per],
            **{f"{when}_{t}_success_mean": float(np.mean([r[when][t]["success"] for r in per]))
               for when in ("before", "after") for t in keys},
            **{f"gain_success_{t}_per_seed": [r[f"gain_success_{t}"] for r in per] for t in keys},
        }  # fmt: skip
        path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
