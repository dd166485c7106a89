"""Imagination branched from real states part-way: how much of the twin correlation the first ``k``
real steps of each rollout buy back, and what they cost in simulator steps.

``vla_wm_quality.py`` found the twins lose their real groups in the imagined closed loop. A branched
twin of real rollout ``i`` executes its first ``k`` steps for real (they are the real rollout's: the
same policy, task and sampling uniforms), then imagines the rest from the real observation at step
``k`` with the same uniforms from there on (the policy on decoded frames, as in training). Per
``k``, on the same real groups (drawn with the twins, ``domain.twin_anchors``):

- the branched twin's **score**: the reward's formula over the real prefix's progress and success
  and the WM's predictions along the imagined rest (``0.5 max success + 0.5 max progress``);
- its **true reward**: the prefix's actions and the imagined ones executed in MuJoCo from the seed;
- ``twin`` = ρ(A(real reward), A(score)), ``closed_loop`` = ρ(A(real), A(true reward)), ``scoring``
  = ρ(A(true reward), A(score)), centred and normalised (``vla_wm_quality.rho``);
- ``sim_share``: the prefixes' simulator steps over the real rollouts' (a rollout that ended before
  ``k`` is its real rollout: its branch costs all its steps).

``k = 0`` is a twin imagined from the real first frame, scored on the imagination's own outcome
predictions (``vla_wm_quality``'s twins are scored by replaying their actions, ``twin_score``).

    uv run python benchmarks/vla_branched_twins.py --seeds 11 12 13 14 --ks 0 5 10 20 \
        --out benchmarks/results/wmq_branched --domain.dagger_rounds=2 ... (the regime's overrides)
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
from vla_wm_quality import group_adv, group_adv_normalised, rho

from wmrl_vla.rollout import replay, rollout_reward
from world_models.vla_dynamics import instruction_ids


def recovered_noise(state: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The CRN uniforms ``domain.generate`` drew first from a generator in ``state``."""
    gen = torch.Generator()
    gen.set_state(state)
    return torch.rand(shape, generator=gen)


def branch(domain, real: list, tasks: list, noise: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Branched twins of the real rollouts ``real`` (``[n]``, group-major, ``noise`` ``[n, T, A]``
    their uniforms): each rollout's first ``k`` steps real, the rest imagined from its step-``k``
    observation. Returns (score ``[n]``, true reward ``[n]``)."""
    g = len(real) // len(tasks)
    score, true = np.empty(len(real)), np.empty(len(real))
    live = [i for i, r in enumerate(real) if r.length > k]
    for i, r in enumerate(real):
        if i not in live:  # it ended within k real steps: the branch is the real rollout
            score[i] = true[i] = r.reward
    if not live:
        return score, true
    wm = domain.world_model.model
    wm.eval()
    task_of = [tasks[i // g] for i in live]
    imgs = torch.from_numpy(np.stack([real[i].images[k] for i in live]))
    sts = torch.from_numpy(np.stack([real[i].states[k] for i in live]))
    instrs = [real[i].instruction for i in live]
    instr_ids = domain.policy.tokenizer.encode(instrs)
    goals = torch.from_numpy(np.stack([domain._initial_obs(t)[3] for t in task_of]))
    limits = [domain.horizon[t.task_id] - k for t in task_of]
    rest = noise[live, k:]

    def act(frames: torch.Tensor, states: torch.Tensor, t: int) -> torch.Tensor:
        _, _, a = domain.policy.act(
            frames, states, instr_ids, domain.temperature, domain.gen, noise=rest[:, t]
        )
        return a

    out = wm.imagine(
        imgs, sts, act, max(limits), generator=domain.gen, instr=instruction_ids(instrs), goal=goals
    )
    for j, i in enumerate(live):
        r, t = real[i], task_of[j]
        n = max(1, min(int(out["mask"][j].sum()), limits[j]))
        prog = np.concatenate([r.progress[:k], out["progress"][j, :n].numpy()])
        succ = np.concatenate([r.success[:k], out["success"][j, :n].numpy()])
        score[i] = rollout_reward(prog, succ)
        actions = np.concatenate([r.actions[:k], out["actions"][j, :n].numpy()])
        true[i] = rollout_reward(*replay(t.task_id, t.seed, t.env_split, actions, domain.max_steps))
    return score, true


def correlations(reward: np.ndarray, score: np.ndarray, true: np.ndarray, g: int) -> dict:
    out = {}
    for form, adv in (("centred", group_adv), ("normalised", group_adv_normalised)):
        a_real, a_score, a_true = adv(reward, g), adv(score, g), adv(true, g)
        out[form] = {
            "twin": rho(a_real, a_score),
            "closed_loop": rho(a_real, a_true),
            "scoring": rho(a_true, a_score),
        }
    return out


def measure(
    preset: str,
    overrides: list[str],
    seeds: list[int],
    groups: int,
    ks: list[int],
    checkpoint: Path | None = None,
) -> dict:
    from wmrl.config import load_config
    from wmrl.tracking import safe_load

    cfg = load_config(preset, [f"--out_dir={tempfile.mkdtemp(prefix='wmrl-branched-')}", *overrides])
    cfg.tracking.progress = False
    domain = cfg.domain.build(cfg)
    if checkpoint is not None:  # a policy part-way through RL, against the WM as pretrained
        domain.policy.load_state_dict(safe_load(checkpoint)["policy"])
    domain.twin_anchors = True
    g = cfg.grpo.group_size
    rows: dict = {
        "reward": [],
        "length": [],
        **{f"score_k{k}": [] for k in ks},
        **{f"true_k{k}": [] for k in ks},
    }
    t0 = time.perf_counter()
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for task_id in domain.tasks:
            tasks = [t for t in domain.sample_tasks(8 * groups * len(domain.tasks), "train", gen)
                     if t.task_id == task_id][:groups]  # fmt: skip
            state = domain.gen.get_state()
            batch = domain.generate(tasks, g, torch.ones(len(tasks), dtype=torch.bool))
            n = len(tasks) * g
            real = [p["rollout"] for p in batch.payload[:n]]
            shape = (len(tasks), g, domain.horizon[task_id], domain.policy.cfg.action_dim)
            noise = recovered_noise(state, shape).flatten(0, 1)
            first = torch.stack([torch.as_tensor(r.bins[0]) for r in real])
            again, _, _ = domain.policy.act(
                torch.from_numpy(np.stack([r.images[0] for r in real])),
                torch.from_numpy(np.stack([r.states[0] for r in real])),
                domain.policy.tokenizer.encode([r.instruction for r in real]),
                domain.temperature,
                None,
                noise=noise[:, 0],
            )
            assert torch.equal(again.cpu(), first), "the recovered uniforms are not the real rollouts'"
            rows["reward"] += [r.reward for r in real]
            rows["length"] += [r.length for r in real]
            for k in ks:
                score, true = branch(domain, real, tasks, noise, k)
                rows[f"score_k{k}"] += score.tolist()
                rows[f"true_k{k}"] += true.tolist()
            print(f"seed {seed} {task_id}: {n} rollouts, {time.perf_counter() - t0:.0f} s", flush=True)
    domain.close()
    reward, length = np.array(rows["reward"]), np.array(rows["length"])
    result: dict = {"preset": preset, "overrides": overrides, "policy": str(checkpoint or "sft"), "seeds": seeds, "groups_per_task": groups,
                    "group_size": g, "rollouts": len(reward), "seconds": time.perf_counter() - t0, "by_k": {}}  # fmt: skip
    for k in ks:
        score, true = np.array(rows[f"score_k{k}"]), np.array(rows[f"true_k{k}"])
        result["by_k"][str(k)] = correlations(reward, score, true, g) | {
            "sim_share": float(np.minimum(length, k).sum() / length.sum()),
            "true_reward_mean": float(true.mean()),
        }
    result["real_reward_mean"] = float(reward.mean())
    result["rows"] = rows
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="vla-rl")
    p.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13, 14])
    p.add_argument("--groups", type=int, default=12, help="real groups per task and seed")
    p.add_argument("--ks", type=int, nargs="+", default=[0, 5, 10, 20], help="real steps before the branch")
    p.add_argument(
        "--checkpoint", type=Path, default=None, help="a run's checkpoint: its policy, not the SFT one"
    )
    p.add_argument("--out", required=True)
    a, overrides = p.parse_known_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    result = measure(a.preset, overrides, a.seeds, a.groups, a.ks, a.checkpoint)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "branched_twins.json").write_text(json.dumps(result, indent=2))
    for k, v in result["by_k"].items():
        c, n = v["centred"], v["normalised"]
        print(f"k={k:>3}  sim share {v['sim_share']:.2f}  twin {c['twin']:.3f} / {n['twin']:.3f}  closed loop "
              f"{c['closed_loop']:.3f} / {n['closed_loop']:.3f}  scoring {c['scoring']:.3f} / {n['scoring']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
