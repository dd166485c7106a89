"""Imagined-rollout quality of the VLA world model, per task, against real rollouts of the same
policy and the same action sequences; the calibration of its variance; and how well imagined twin
groups track their real groups.

From a preset's cached SFT policy and world model (built if missing), ``--groups`` real groups of
``G`` (the preset's group size) rollouts per task are run in MuJoCo, the policy sampling at the
preset's temperature from per-rollout uniforms (common random numbers), on training seeds the WM
never saw. Then, per task:

- **frames**: the WM replays each real action sequence open-loop from the real first frame
  (``VLADynamics.imagine``, the actions fed in); frame MSE and PSNR (pixels in [0, 1]) against the
  real frame at every step of the horizon;
- **outcomes**: the WM's rollout score (``predict``: members' mean, latent space) against the real
  reward: success AUC, Spearman of score and reward, MAE;
- **calibration**: mean z^2 = e^2 / v of the ensemble's variance, raw and calibrated
  (``v' = a v + b``, :func:`~world_models.vla_dynamics.fit_variance_calibration`): fitted on the
  WM's own held-out pretraining episodes (what a run starts from) and cross-fitted on these
  rollouts (groups split in two folds; each fold's z^2 under the fit on the other);
- **twins**: each real group's imagined twin (the policy acting on decoded frames) drawn with the
  same uniforms (CRN) and with fresh ones (independent), scored by ``predict``; the correlation of
  their group advantages with the real group's (``ppi/rho``'s statistic: sum A Â / sqrt(sum A^2 sum
  Â^2) over rows), and that of the real rollouts' own WM scores (the shared-rollout upper bound);
  the CRN twins' also within each kind of real group (mixed, all successes, all failures), on
  centred advantages and on the std-normalised ones training uses; and the CRN twins scored by
  each form of the rollout score (:data:`SCORE_FORMS`: the reward's formula on the heads, its
  expectation when a success brings full progress, that with thresholded success heads).
- **where the twins part**: each CRN twin's imagined action sequence executed in MuJoCo from its
  task's seed (``replay``), which splits the twin correlation in two (:func:`twin_decomposition`):
  the imagined closed loop (do the twin's own actions, executed, keep its real group's advantages?)
  and the WM's scoring of them (does its score follow what those actions really do?).
- **anchor choice**: what executing the groups the WM picks (drawn with unequal probabilities,
  weighted by ``1/π``) would save against uniform anchors, per candidate need read from the twins
  (:func:`anchor_choice_variance`); ``--seed`` repeats the measurement on other groups and ``--pool``
  pools the groups of several reports (``<out>/anchor_choice.json``).

Also saves one side-by-side GIF per task (real | open-loop imagined | CRN twin).

    uv run python benchmarks/vla_wm_quality.py --preset vla-rl --groups 12 --out benchmarks/results
    ... --checkpoint RUN/checkpoints/latest.pt   # e.g. a run of half the steps: a policy halfway through RL
    ... --pool DIR_S11/vla_wm_quality.json DIR_S12/vla_wm_quality.json --out DIR   # anchor choice and twins, pooled

Writes ``<out>/vla_wm_quality.json`` and ``.png``. Not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from wmrl_vla.rollout import goal_or_zeros, replay, rollout_reward
from world_models.vla_dynamics import expected_rollout_reward, instruction_ids, rollout_score


def _psnr(mse: float) -> float:
    return 10 * math.log10(1.0 / max(mse, 1e-10))


def open_loop_frame_mse(wm, rollouts) -> np.ndarray:
    """``[E, T]`` frame MSE (pixels in [0, 1]) of the WM replaying each real rollout's actions from
    its first frame against the real frame after step t (NaN past the rollout's end)."""
    t_max = max(r.length for r in rollouts)
    a_dim = rollouts[0].actions.shape[1]
    acts = torch.zeros(len(rollouts), t_max, a_dim)
    for i, r in enumerate(rollouts):
        acts[i, : r.length] = torch.from_numpy(r.actions)
    imgs = torch.from_numpy(np.stack([r.images[0] for r in rollouts]))
    sts = torch.from_numpy(np.stack([r.states[0] for r in rollouts]))
    # horizon t_max + 1: the frame after the last action is the policy's view at step t_max
    words = instruction_ids([r.instruction for r in rollouts])
    goals = torch.from_numpy(np.stack([goal_or_zeros(r.goal) for r in rollouts]))
    out = wm.imagine(imgs, sts, lambda f, s, t: acts[:, min(t, t_max - 1)], t_max + 1, success_threshold=2.0,
                     instr=words, goal=goals)  # fmt: skip
    pred = out["images"][:, 1:].float() / 255.0  # [E, T, 3, H, W]: after actions 0..T-1
    mse = np.full((len(rollouts), t_max), np.nan)
    for i, r in enumerate(rollouts):
        real = torch.from_numpy(r.images[1 : r.length + 1]).float() / 255.0
        mse[i, : r.length] = ((pred[i, : r.length] - real) ** 2).mean((1, 2, 3)).numpy()
    return mse


def side_by_side_gif(wm, real, twin_images: np.ndarray, path: Path) -> None:
    """GIF of a real rollout | the WM replaying its actions open-loop | its imagined CRN twin."""
    acts = torch.from_numpy(real.actions)
    n = real.length
    replay = wm.imagine(torch.from_numpy(real.images[:1]), torch.from_numpy(real.states[:1]),
                        lambda f, s, t: acts[min(t, n - 1)][None], n + 1, success_threshold=2.0,
                        instr=instruction_ids([real.instruction]),
                        goal=torch.from_numpy(goal_or_zeros(real.goal))[None])  # fmt: skip
    clips = [real.images, replay["images"][0].numpy(), twin_images]
    t_len = max(len(c) for c in clips)
    clips = [np.concatenate([c, np.repeat(c[-1:], t_len - len(c), 0)]) for c in clips]
    from wmrl_vla.media import save_gif

    save_gif(np.concatenate(clips, axis=3), path)


FIRST_STEPS = 8


@torch.no_grad()
def first_steps_score(wm, batch, n: int, steps: int) -> np.ndarray:
    """``[n]`` the WM's mean score of the first ``n`` rollouts' action sequences over their first
    ``steps`` steps only (the training window of the preset's WM)."""
    ex = batch.extras
    mask = ex["step_mask"][:n].float().clone()
    mask[:, steps:] = 0
    prog, succ = wm.score_actions(ex["init_images"][:n], ex["init_states"][:n], ex["actions"][:n], mask,
                                  ex["wm_instr"][:n], ex["wm_goal"][:n])  # fmt: skip
    return rollout_score(prog.cpu(), succ.cpu()).mean(0).numpy()


#: the WM's rollout score from its heads' progress and success: the reward's formula applied to
#: them (what the WM reports), its expectation under "a success brings full progress", and that
#: with the success heads thresholded at 0.5
SCORE_FORMS = {
    "reward_formula": lambda prog, succ: rollout_score(prog, succ),
    "expected": lambda prog, succ: expected_rollout_reward(prog, succ),
    "expected_hard": lambda prog, succ: expected_rollout_reward(prog, (succ > 0.5).float()),
}


@torch.no_grad()
def scores_by_form(wm, batch, rows: slice) -> dict[str, np.ndarray]:
    """``{form: [n]}`` the members' mean score of ``batch``'s ``rows`` under each of
    :data:`SCORE_FORMS`."""
    ex = batch.extras
    prog, succ = wm.score_actions(ex["init_images"][rows], ex["init_states"][rows], ex["actions"][rows],
                                  ex["step_mask"][rows].float(), ex["wm_instr"][rows],
                                  ex["wm_goal"][rows])  # fmt: skip
    prog, succ = prog.cpu(), succ.cpu()
    return {name: form(prog, succ).mean(0).numpy() for name, form in SCORE_FORMS.items()}


def group_adv(r: np.ndarray, g: int) -> np.ndarray:
    """``[n * g]`` rewards, group-major -> group-centred advantages (the preset's GRPO centring)."""
    x = r.reshape(-1, g)
    return (x - x.mean(1, keepdims=True)).reshape(-1)


def group_adv_normalised(r: np.ndarray, g: int, std_eps: float = 1e-4, std_floor: float = 0.0) -> np.ndarray:
    """:func:`group_adv` divided by ``max(group std, std_floor) + std_eps`` (``grpo.advantage=grpo``,
    what training uses, has no floor): without one a near-flat group's tiny differences become
    unit-sized advantages."""
    x = r.reshape(-1, g)
    std = np.maximum(x.std(1, keepdims=True), std_floor)
    return ((x - x.mean(1, keepdims=True)) / (std + std_eps)).reshape(-1)


#: floors on the twins' group std (reward units) tried by ``twin_rho_normalised_by_wm_std_floor``
WM_STD_FLOORS = (0.0, 0.02, 0.05, 0.1, 0.2)


def rho(a: np.ndarray, b: np.ndarray) -> float:
    den = math.sqrt(float((a**2).sum() * (b**2).sum()))
    return float((a * b).sum()) / den if den > 0 else float("nan")


GROUP_KINDS = ("mixed", "all_success", "all_fail")


def rho_by_group_kind(adv_real: np.ndarray, adv_twin: np.ndarray, success: np.ndarray, g: int) -> dict:
    """The twin correlation within each kind of real group: ``mixed`` (successes and failures),
    ``all_success``, ``all_fail``; per kind its groups, its share of the real advantages' sum of
    squares (what it weighs in the pooled figure) and :func:`rho` over its rows. Inputs ``[n * g]``,
    group-major; ``success`` 0/1 per real rollout."""
    s = success.reshape(-1, g)
    kind = np.where(s.min(1) > 0, "all_success", np.where(s.max(1) == 0, "all_fail", "mixed"))
    rows = np.repeat(kind, g)
    total = float((adv_real**2).sum())
    return {
        k: {
            "groups": int((kind == k).sum()),
            "adv_share": float((adv_real[rows == k] ** 2).sum()) / total if total > 0 else float("nan"),
            "crn_twin": rho(adv_real[rows == k], adv_twin[rows == k]),
        }
        for k in GROUP_KINDS
    }


def twin_decomposition(rows: dict[str, np.ndarray], g: int) -> dict:
    """Where an imagined CRN twin loses its real group's advantages.

    ``rows`` holds ``[n * g]`` arrays, group-major, row ``i`` of each the real rollout ``i`` or its
    twin: ``reward`` and ``success`` (the real rollouts), ``twin_replayed_reward`` and
    ``twin_replayed_success`` (the twin's imagined actions executed in MuJoCo), ``twin_score`` (the
    WM's score of the twin: what training uses), ``self_score`` (the WM's score of the real
    rollout's actions) and ``twin_claimed`` (1 where imagination ended the twin on a predicted
    success). With ``A(x)`` the group advantages of ``x`` and :func:`rho` their correlation, per
    advantage form (``centred``, and ``normalised`` as training uses):

    - ``real_vs_twin_replayed`` = ρ(A(reward), A(twin_replayed_reward)): the imagined closed loop,
      scored perfectly: how well the twin's own actions, executed, track the real group's advantages;
    - ``twin_replayed_vs_wm`` = ρ(A(twin_replayed_reward), A(twin_score)): the WM's scoring of the
      twin's actions against what they really do;
    - ``real_vs_wm`` = ρ(A(reward), A(twin_score)): the twin correlation (``crn_twin``);
    - ``real_vs_wm_of_real`` = ρ(A(reward), A(self_score)): the WM scoring the real actions
      (``shared_rollout``);

    each also per kind of real group (:func:`rho_by_group_kind`). Also the success rates and, of the
    twins imagination ended on a predicted success, the share that succeed when executed."""
    r = {k: np.asarray(v, dtype=float) for k, v in rows.items()}
    out: dict = {}
    for form, adv in (("centred", group_adv), ("normalised", group_adv_normalised)):
        real, replayed, wm, own = (
            adv(r[k], g) for k in ("reward", "twin_replayed_reward", "twin_score", "self_score")
        )
        out[form] = {
            "real_vs_twin_replayed": rho(real, replayed),
            "twin_replayed_vs_wm": rho(replayed, wm),
            "real_vs_wm": rho(real, wm),
            "real_vs_wm_of_real": rho(real, own),
            "real_vs_twin_replayed_by_group_kind": rho_by_group_kind(real, replayed, r["success"], g),
            "twin_replayed_vs_wm_by_group_kind": rho_by_group_kind(
                replayed, wm, r["twin_replayed_success"], g
            ),
        }
    claimed = r["twin_claimed"] > 0
    out["success"] = {
        "real": float(r["success"].mean()),
        "twin_replayed": float(r["twin_replayed_success"].mean()),
        "twin_claimed": float(claimed.mean()),
        "twin_replayed_given_claimed": float(r["twin_replayed_success"][claimed].mean())
        if claimed.any()
        else None,
        "twin_replayed_given_not_claimed": (
            float(r["twin_replayed_success"][~claimed].mean()) if (~claimed).any() else None
        ),
    }
    return out


#: the WM-guided anchor choice's floors tried by :func:`anchor_choice_variance` (1.0 is uniform)
ANCHOR_FLOORS = (0.1, 0.2, 0.5)


def anchor_needs(per_group: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """``{name: [T]}`` candidate needs of each real group for a WM-guided anchor choice: three read
    from its imagined CRN twin alone (what a choice made before any execution could use) and the
    oracle's, read from the real group itself.

    - ``wm_spread``: ``sqrt(var_j r̂_j + mean_j v_j)``, the twin's score spread plus the WM's
      (calibrated) variance: the generic expected spread of the group's rewards;
    - ``wm_shortfall``: ``1 − mean_j r̂_j``: a group the WM sees succeed everywhere (score 1) would
      come back all successes, its GRPO advantages all zero;
    - ``wm_shortfall_calibrated``: ``sqrt P(real group not flat | shortfall)``, isotonic, cross-fitted
      over two random halves of the groups (the optimal ``π ∝ sqrt E|a_t|²`` if it were exact);
    - ``oracle``: ``sqrt |a_t|²``, the lowest variance any choice reaches.
    """
    from sklearn.isotonic import IsotonicRegression

    sq, mean = np.asarray(per_group["sq"]), np.asarray(per_group["twin_mean"])
    shortfall = 1.0 - mean
    nonflat = (sq > 0).astype(float)
    fold = np.random.default_rng(seed).permutation(len(sq)) % 2
    p_nonflat = np.empty(len(sq))
    for f in (0, 1):
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        p_nonflat[fold == f] = iso.fit(shortfall[fold != f], nonflat[fold != f]).predict(shortfall[fold == f])
    return {
        "wm_spread": np.asarray(per_group["need"]),
        "wm_shortfall": np.clip(shortfall, 0.0, None),
        "wm_shortfall_calibrated": np.sqrt(p_nonflat),
        "oracle": np.sqrt(sq),
    }


def anchor_choice_variance(
    group_sq: np.ndarray, needs: dict[str, np.ndarray], tasks_per_step: int, k: int, shuffles: int = 300,
    seed: int = 0,
) -> dict:  # fmt: skip
    """How much a WM-guided anchor choice would cut the variance of the anchors' part of the update.

    The pooled real groups are dealt into steps of ``tasks_per_step``; a step executes ``k`` of them
    with probabilities :func:`wmrl.anchors.inclusion_probabilities` of their ``need`` (per candidate
    of :func:`anchor_needs`, per floor) and weights the anchors' advantages by ``1/π_t``
    (Horvitz-Thompson: unbiased for any ``π``). With the groups' gradients orthogonal (the
    equal-direction approximation ``ppi``'s λ uses) the estimate's variance is
    ``Σ_t |a_t|² (1/π_t − 1)`` for any sampling design with those ``π``; its ratio to the uniform
    ``π = k/N`` is averaged over ``shuffles`` dealings, and ``k / ratio`` is the uniform anchor count
    that would give the same variance. ``group_sq`` ``[T]``: each real group's ``|a_t|²`` (sum of
    its squared normalised advantages; 0 for a flat group)."""
    from wmrl.anchors import inclusion_probabilities
    from world_models.vla_dynamics import success_auc

    rng = np.random.default_rng(seed)
    n_steps = len(group_sq) // tasks_per_step
    cells = [(name, f) for name in needs for f in ((0.0,) if name == "oracle" else ANCHOR_FLOORS)]
    acc = {cell: 0.0 for cell in cells}
    base = 0.0
    for _ in range(shuffles):
        order = rng.permutation(len(group_sq))[: n_steps * tasks_per_step].reshape(n_steps, tasks_per_step)
        for idx in order:
            sq = group_sq[idx]
            base += float((sq * (tasks_per_step / k - 1)).sum())
            for name, floor in cells:
                pi = inclusion_probabilities(torch.from_numpy(needs[name][idx]), k, floor).numpy()
                acc[(name, floor)] += float(np.where(sq > 0, sq * (1 / np.maximum(pi, 1e-12) - 1), 0.0).sum())
    nonflat = (group_sq > 0).astype(float)
    out: dict = {}
    for name in needs:
        out[name] = {
            "auc_nonflat": success_auc(needs[name], nonflat) if 0 < nonflat.sum() < len(nonflat) else None
        }
        for (n, floor), var in acc.items():
            if n == name:
                ratio = var / base
                out[name][f"floor_{floor}"] = {
                    "variance_ratio": ratio,
                    "equivalent_uniform_anchors": k / ratio,
                }
    return out


def action_agreement(real_bins: list[np.ndarray], twin_bins: list[np.ndarray]) -> list[float]:
    """``[T]`` the share of action dimensions whose bin the CRN twin drew equal to its real rollout's
    at step ``t``, over the pairs that both reach ``t`` (each ``[T_i, A]``): how long the imagined
    closed loop keeps choosing what the real one chose."""
    t_max = max(min(len(a), len(b)) for a, b in zip(real_bins, twin_bins, strict=True))
    out = []
    for t in range(t_max):
        same = [
            np.mean(a[t] == b[t])
            for a, b in zip(real_bins, twin_bins, strict=True)
            if t < min(len(a), len(b))
        ]
        out.append(float(np.mean(same)))
    return out


def twin_rows(domain, batch, reward: np.ndarray, success: np.ndarray, score: np.ndarray, n: int) -> dict:
    """The per-rollout arrays :func:`twin_decomposition` reads, for a batch of ``n`` real rollouts
    followed by their ``n`` CRN twins (``score`` ``[2n]``: the WM's score of each row): every twin's
    imagined actions executed in MuJoCo from its task's seed (:func:`~wmrl_vla.rollout.replay`)."""
    replayed_reward, replayed_success, claimed = [], [], []
    for i in range(n, 2 * n):
        p = batch.payload[i]
        task = batch.tasks[int(batch.group_ids[i])]
        prog, succ = replay(p["task_id"], p["seed"], task.env_split, p["actions"], domain.max_steps)
        replayed_reward.append(rollout_reward(prog, succ))
        replayed_success.append(float(succ.max()) if len(succ) else 0.0)
        claimed.append(float(len(p["actions"]) < domain.horizon[p["task_id"]]))
    return {
        "reward": reward,
        "success": success,
        "twin_replayed_reward": np.array(replayed_reward),
        "twin_replayed_success": np.array(replayed_success),
        "twin_score": score[n:],
        "self_score": score[:n],
        "twin_claimed": np.array(claimed),
    }


def measure(
    preset: str, groups: int, out: Path, extra: list[str], checkpoint: Path | None = None, seed: int = 2024
) -> dict:
    from scipy.stats import spearmanr

    from wmrl.config import load_config
    from world_models.vla_dynamics import calibration_stats, fit_variance_calibration, success_auc

    cfg = load_config(preset, [f"--out_dir={tempfile.mkdtemp(prefix='wmrl-wm-quality-')}", *extra])
    cfg.tracking.progress = False
    domain = cfg.domain.build(cfg)
    policy_step = 0
    if checkpoint is not None:  # a policy part-way through RL, against the WM as pretrained
        from wmrl.tracking import safe_load

        state = safe_load(checkpoint)
        domain.policy.load_state_dict(state["policy"])
        policy_step = int(state["step"])
    g = cfg.grpo.group_size
    wm = domain.world_model
    pre_calib = (wm.var_scale, wm.var_floor)
    report: dict = {"preset": preset, "overrides": extra, "group_size": g, "groups_per_task": groups,
                    "policy": str(checkpoint) if checkpoint else "sft", "policy_step": policy_step, "seed": seed,
                    "pretraining_calibration": list(pre_calib), "tasks": {}}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    domain.twin_anchors = True
    t0 = time.perf_counter()
    keys = (
        "sq",
        "var",
        "var_crn",
        "success",
        "reward",
        "score_crn",
        "adv_real",
        "adv_self",
        "adv_crn",
        "adv_ind",
    )
    pooled: dict[str, list] = {k: [] for k in (*keys, *(f"form_{f}" for f in SCORE_FORMS))}
    for task_id in domain.tasks:
        tasks = [t for t in domain.sample_tasks(8 * groups * len(domain.tasks), "train", gen)
                 if t.task_id == task_id][:groups]  # fmt: skip
        batch = domain.generate(tasks, g, torch.ones(len(tasks), dtype=torch.bool))
        n = len(tasks) * g
        real = [p["rollout"] for p in batch.payload[:n]]
        reward = np.array([r.reward for r in real])
        success = np.array([float(r.success.max()) for r in real])
        raw = wm.raw_predict(batch)
        score, var = raw.mean.numpy(), raw.var.numpy()
        indep = domain._imagine(tasks, g)  # the same tasks imagined with fresh sampling noise
        ind_batch = domain._collate(indep, tasks, g)
        score_ind = wm.raw_predict(ind_batch).mean.numpy()
        mse = open_loop_frame_mse(wm.model, real)
        rows = twin_rows(domain, batch, reward, success, score, n)
        sq = (score[:n] - reward) ** 2
        # calibration, cross-fitted over two folds of whole groups
        fold = (np.arange(n) // g) % 2
        z2_cross = np.empty(n)
        for f in (0, 1):
            a, b = fit_variance_calibration(sq[fold != f], var[:n][fold != f])
            z2_cross[fold == f] = sq[fold == f] / np.maximum(a * var[:n][fold == f] + b, 1e-8)
        adv = {"real": group_adv(reward, g), "self": group_adv(score[:n], g),
               "crn": group_adv(score[n:], g), "ind": group_adv(score_ind, g)}  # fmt: skip
        per_step = np.nanmean(mse, 0)
        lengths = np.array([r.length for r in real], dtype=float)
        early = first_steps_score(wm.model, batch, n, FIRST_STEPS)
        res = {
            "rollouts": n,
            "real_success": float(success.mean()),
            "real_reward": float(reward.mean()),
            "mean_length": float(np.mean([r.length for r in real])),
            "frame_mse_per_step": per_step.tolist(),
            "frame_psnr_per_step": [_psnr(m) for m in per_step],
            "frame_psnr_step1": _psnr(per_step[0]),
            "frame_psnr_mean_over_horizon": _psnr(float(np.nanmean(mse))),
            "success_auc": success_auc(score[:n], success),
            "reward_spearman": float(spearmanr(score[:n], reward).statistic),
            "score_mae": float(np.abs(score[:n] - reward).mean()),
            # a successful episode ends early: how much of the score's ranking is episode length
            "success_auc_of_shorter_episode": success_auc(-lengths, success),
            "score_length_spearman": float(spearmanr(score[:n], lengths).statistic),
            f"success_auc_first{FIRST_STEPS}_steps": success_auc(early, success),
            "z2_raw": calibration_stats(sq, var[:n]),
            "z2_pretraining_calibration": calibration_stats(sq, var[:n], *pre_calib),
            "z2_cross_fitted": {"z2_mean": float(z2_cross.mean()), "z2_median": float(np.median(z2_cross))},
            "twin_rho": {
                "shared_rollout": rho(adv["real"], adv["self"]),
                "crn_twin": rho(adv["real"], adv["crn"]),
                "independent_twin": rho(adv["real"], adv["ind"]),
            },  # fmt: skip
            "twin_rho_by_group_kind": rho_by_group_kind(adv["real"], adv["crn"], success, g),
            "twin_rho_by_group_kind_normalised": rho_by_group_kind(
                group_adv_normalised(reward, g), group_adv_normalised(score[n:], g), success, g
            ),
            "twin_decomposition": twin_decomposition(rows, g),
            "twin_action_agreement_per_step": action_agreement(
                [batch.payload[i]["bins"] for i in range(n)], [batch.payload[n + i]["bins"] for i in range(n)]
            ),
            "twin_same_first_action": float(
                np.mean(
                    [
                        np.array_equal(batch.payload[i]["bins"][0], batch.payload[n + i]["bins"][0])
                        for i in range(n)
                    ]
                )
            ),  # fmt: skip
        }
        report["tasks"][task_id] = res
        for k, v in rows.items():
            pooled.setdefault(f"row_{k}", []).append(v)
        pooled["sq"].append(sq)
        pooled["var"].append(var[:n])
        pooled["success"].append(success)
        pooled["reward"].append(reward)
        pooled["score_crn"].append(score[n:])
        pooled["var_crn"].append(var[n:])
        for f, twin_scores in scores_by_form(wm.model, batch, slice(n, None)).items():
            pooled[f"form_{f}"].append(twin_scores)
        for k in ("real", "self", "crn", "ind"):
            pooled[f"adv_{k}"].append(adv[k])
        name = task_id.split("/")[-1]
        side_by_side_gif(wm.model, real[0], batch.payload[n]["images"], out / f"vla_wm_quality_{name}.gif")
        print(f"{task_id}: {json.dumps({k: v for k, v in res.items() if 'per_step' not in k})}", flush=True)
    sq, var = np.concatenate(pooled["sq"]), np.concatenate(pooled["var"])
    adv = {k: np.concatenate(v) for k, v in pooled.items() if k.startswith("adv_")}
    success, reward, score_crn = (np.concatenate(pooled[k]) for k in ("success", "reward", "score_crn"))
    adv_real_normalised = group_adv_normalised(reward, g)
    form_scores = {f: np.concatenate(pooled[f"form_{f}"]) for f in SCORE_FORMS}  # the CRN twins' [n]
    form_normalised = {f: group_adv_normalised(x, g) for f, x in form_scores.items()}
    report["pooled"] = {
        "z2_raw": calibration_stats(sq, var),
        "z2_pretraining_calibration": calibration_stats(sq, var, *pre_calib),
        "z2_cross_fitted_mean_over_tasks": float(
            np.mean([r["z2_cross_fitted"]["z2_mean"] for r in report["tasks"].values()])
        ),
        "twin_rho": {
            "shared_rollout": rho(adv["adv_real"], adv["adv_self"]),
            "crn_twin": rho(adv["adv_real"], adv["adv_crn"]),
            "independent_twin": rho(adv["adv_real"], adv["adv_ind"]),
        },  # fmt: skip
        "twin_rho_by_group_kind": rho_by_group_kind(adv["adv_real"], adv["adv_crn"], success, g),
        "twin_rho_by_group_kind_normalised": rho_by_group_kind(
            adv_real_normalised, group_adv_normalised(score_crn, g), success, g
        ),
        # the real groups normalised as training does; the twins' with a floor on their std
        "twin_rho_normalised_by_wm_std_floor": {
            str(f): rho(adv_real_normalised, group_adv_normalised(score_crn, g, std_floor=f))
            for f in WM_STD_FLOORS
        },
        # the twins scored by each form of the rollout score: pooled, on centred and normalised
        # advantages, and per kind of real group (normalised)
        "twin_rho_by_score_form": {
            f: {
                "centred": rho(adv["adv_real"], group_adv(form_scores[f], g)),
                "normalised": rho(adv_real_normalised, form_normalised[f]),
                "by_group_kind_normalised": rho_by_group_kind(
                    adv_real_normalised, form_normalised[f], success, g
                ),
            }
            for f in SCORE_FORMS
        },
    }
    rows = {k[4:]: np.concatenate(v) for k, v in pooled.items() if k.startswith("row_")}
    report["pooled"]["twin_decomposition"] = twin_decomposition(rows, g)
    report["pooled"]["rows"] = {k: v.tolist() for k, v in rows.items()}
    # the WM choosing which groups to execute: each real group's weight in the update against what
    # its CRN twin shows before any execution (wm_spread with the pretraining-calibrated variance)
    group_sq = (adv_real_normalised.reshape(-1, g) ** 2).sum(1)
    twins = score_crn.reshape(-1, g)
    twin_var = np.concatenate(pooled["var_crn"]).reshape(-1, g)
    per_group = {
        "sq": group_sq.tolist(),
        "need": np.sqrt(twins.var(1) + (pre_calib[0] * twin_var + pre_calib[1]).mean(1)).tolist(),
        "twin_mean": twins.mean(1).tolist(),
        "twin_spread": twins.std(1).tolist(),
        "twin_var": twin_var.mean(1).tolist(),
        "real_success": success.reshape(-1, g).mean(1).tolist(),
    }
    report["pooled"]["anchor_choice"] = anchor_choice(per_group, cfg)
    report["seconds"] = time.perf_counter() - t0
    domain.close()
    return report


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    names = [t.split("/")[-1] for t in report["tasks"]]
    for t, r in report["tasks"].items():
        ax[0].plot(
            np.arange(1, len(r["frame_psnr_per_step"]) + 1), r["frame_psnr_per_step"], label=t.split("/")[-1]
        )
    ax[0].set_xlabel("open-loop step")
    ax[0].set_ylabel("frame PSNR (dB)")
    ax[0].legend()
    x = np.arange(len(names))
    z = [[r["z2_raw"]["z2_mean"], r["z2_pretraining_calibration"]["z2_mean"], r["z2_cross_fitted"]["z2_mean"]]
         for r in report["tasks"].values()]  # fmt: skip
    for k, lab in enumerate(("raw", "pretraining calibration", "cross-fitted calibration")):
        ax[1].bar(x + 0.27 * (k - 1), [v[k] for v in z], 0.27, label=lab)
    ax[1].axhspan(0.5, 2.0, color="g", alpha=0.1)
    ax[1].set_yscale("log")
    ax[1].set_xticks(x, names)
    ax[1].set_ylabel("mean z^2 (1 = calibrated)")
    ax[1].legend()
    rhos = [[r["twin_rho"][k] for k in ("shared_rollout", "crn_twin", "independent_twin")]
            for r in report["tasks"].values()]  # fmt: skip
    for k, lab in enumerate(("WM score of the real rollout", "CRN twin", "independent twin")):
        ax[2].bar(x + 0.27 * (k - 1), [v[k] for v in rhos], 0.27, label=lab)
    ax[2].set_xticks(x, names)
    ax[2].set_ylabel("corr(real group adv, WM group adv)")
    ax[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def anchor_choice(per_group: dict, cfg) -> dict:
    """The groups, the flat ones among them and :func:`anchor_choice_variance` of every need in
    :func:`anchor_needs`, at the run's groups per step and anchors."""
    sq = np.asarray(per_group["sq"])
    k = cfg.anchors.count(cfg.grpo.tasks_per_step)
    return {
        "groups": len(sq),
        "flat_real_groups": int((sq == 0).sum()),
        "tasks_per_step": cfg.grpo.tasks_per_step,
        "anchors_per_step": k,
        "per_group": per_group,
        # fewer groups than one step holds: no step to deal them into (pool more with --pool)
        "needs": anchor_choice_variance(sq, anchor_needs(per_group), cfg.grpo.tasks_per_step, k)
        if len(sq) >= cfg.grpo.tasks_per_step
        else None,
    }


def pool_reports(reports: list[Path], out: Path) -> None:
    """:func:`anchor_choice` on the groups of several reports of one policy (other seeds), and
    :func:`twin_decomposition` on their rollouts where the reports hold them."""
    from wmrl.config import load_config

    runs = [json.loads(r.read_text()) for r in reports]
    if len({(r["policy"], r["preset"], tuple(r["overrides"])) for r in runs}) != 1:
        raise SystemExit("--pool: the reports measure different policies or configs")
    groups = [r["pooled"]["anchor_choice"]["per_group"] for r in runs]
    per_group = {key: [v for grp in groups for v in grp[key]] for key in groups[0]}
    result = {"reports": [str(r) for r in reports], "policy": runs[0]["policy"]}
    cfg = load_config(runs[0]["preset"], runs[0]["overrides"])
    result |= anchor_choice(per_group, cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "anchor_choice.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "per_group"}, indent=2))
    if all("rows" in r["pooled"] for r in runs):  # reports measured with the twins executed
        rows = {k: np.concatenate([r["pooled"]["rows"][k] for r in runs]) for k in runs[0]["pooled"]["rows"]}
        twins = {"reports": result["reports"], "policy": result["policy"], "rollouts": len(rows["reward"])}
        twins["twin_decomposition"] = twin_decomposition(rows, cfg.grpo.group_size)
        curves = {
            t: [r["tasks"][t]["twin_action_agreement_per_step"] for r in runs] for t in runs[0]["tasks"]
        }
        twins["twin_action_agreement_per_step"] = {  # the reports' mean, over the steps all reach
            t: np.mean([c[: min(map(len, cs))] for c in cs], 0).tolist() for t, cs in curves.items()
        }
        (out / "twin_decomposition.json").write_text(json.dumps(twins, indent=2))
        print(json.dumps(twins, indent=2))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="vla-rl")
    p.add_argument("--groups", type=int, default=12, help="real groups per task")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a run's checkpoint (e.g. RUN/checkpoints/latest.pt of a run of half the steps): "
                        "measure on that policy's rollouts instead of the SFT policy's (the WM as "
                        "pretrained)")  # fmt: skip
    p.add_argument(
        "--seed",
        type=int,
        default=2024,
        help="the tasks' and the sampling's seed (repeat "
        "with other seeds and --pool for more groups than fit in memory at once)",
    )
    p.add_argument("--pool", type=Path, nargs="+", default=None, metavar="REPORT",
                   help="instead of measuring: pool the groups of these reports (one policy, several "
                        "seeds) into <out>/anchor_choice.json and <out>/twin_decomposition.json")  # fmt: skip
    a, extra = p.parse_known_args(argv)
    if a.pool:
        pool_reports(a.pool, Path(a.out))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = measure(a.preset, a.groups, out, extra, a.checkpoint, a.seed)
    (out / "vla_wm_quality.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "vla_wm_quality.png")
    print(json.dumps(report["pooled"], indent=2))


if __name__ == "__main__":
    main()
