"""How well a grounded VLA world model (``domain.wm_outcome=state``) rolls the state forward, and
whether its outcome heads know success, on fresh real groups of the preset's SFT policy.

From the preset's cached SFT policy and WM (built if missing), ``--tasks`` training tasks x the
preset's group size rollouts are run in MuJoCo; then member 0's grounded heads replay each
rollout's real actions from its real first state. Reported: the hand position error (metres) at
steps 1, 5, 10, 20, 30, 40, 50 (and in the table plane alone, beside the same error of a fixed
reference for our own tasks: the start's hand xy plus the actions' sum, each moving the target by
``MOVE_SCALE`` and clamped to the workspace, which is how those tasks move the hand's target); the
success AUC of the geometric ReachColor/PressButton-style test (hand within 3 cm of the goal xy and
under 4 cm high) applied to the rolled states and to the real states; and the success AUC of the outcome heads on the rolled states and on the real states.

    uv run python benchmarks/vla_grounded_state.py --preset vla-rl --out benchmarks/results/wmq_grounded

Writes ``<out>/vla_grounded_state.json``. Not a test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch


def measure(preset: str, n_tasks: int, extra: list[str]) -> dict:
    from wmrl.config import load_config
    from world_models.vla_dynamics import Grounding, success_auc

    cfg = load_config(preset, [f"--out_dir={tempfile.mkdtemp(prefix='wmrl-grounded-')}", *extra])
    cfg.tracking.progress = False
    domain = cfg.domain.build(cfg)
    wm = domain.world_model.model
    if wm.grounded is None:
        raise SystemExit(f"{preset}'s world model has latent heads: pass --domain.wm_outcome=state")
    tasks = domain.sample_tasks(n_tasks, "train", torch.Generator().manual_seed(7))
    batch = domain.generate(tasks, cfg.grpo.group_size, torch.ones(len(tasks), dtype=torch.bool))
    ex, real = batch.extras, [p["rollout"] for p in batch.payload]
    label = np.array([float(r.success.max()) for r in real])
    gm = wm.grounded[0]
    with torch.no_grad():
        z0, _ = wm.observe(ex["init_images"], ex["init_states"], ex["wm_instr"])
        ground = wm.grounding(z0, ex["init_states"], ex["wm_goal"], ex["wm_instr"])
        rolled, _, _ = gm.roll(ex["init_states"].float(), ex["actions"], ground)  # [N, T, S]
        head_rolled, head_real, err = [], [], []
        for i, r in enumerate(real):
            n = r.length
            err.append((rolled[i, :n, :3] - torch.from_numpy(r.states[1 : n + 1, :3])).norm(dim=-1).numpy())
            gi = Grounding(*(x[i : i + 1].expand(n, -1) for x in ground))
            head_rolled.append(float(torch.sigmoid(gm.outcome_of(rolled[i, :n], gi)[1]).max()))
            st = torch.from_numpy(r.states[1 : n + 1]).float()
            head_real.append(float(torch.sigmoid(gm.outcome_of(st, gi)[1]).max()))

    def geometric(states: np.ndarray, goal: np.ndarray) -> float:
        return float(((np.linalg.norm(states[:, :2] - goal, axis=-1) < 0.03) & (states[:, 2] < 0.04)).any())

    from sims.own.base import MOVE_SCALE, WORKSPACE_HI, WORKSPACE_LO

    def action_sum_xy(r) -> np.ndarray:  # [n, 2]: the hand's target moved by the actions, clamped
        xy, out = r.states[0, :2].astype(float), []
        for a in r.actions[: r.length]:
            xy = np.clip(xy + np.clip(a[:2], -1, 1) * MOVE_SCALE, WORKSPACE_LO[:2], WORKSPACE_HI[:2])
            out.append(xy)
        return np.array(out)

    xy_err = [
        (rolled[i, : r.length, :2] - torch.from_numpy(r.states[1 : r.length + 1, :2])).norm(dim=-1).numpy()
        for i, r in enumerate(real)
    ]
    ref_err = [np.linalg.norm(action_sum_xy(r) - r.states[1 : r.length + 1, :2], axis=-1) for r in real]

    def at(errs: list, k: int) -> float:
        return float(np.mean([e[min(k, len(e)) - 1] for e in errs]))

    goals = ex["wm_goal"].numpy()
    geo_rolled = [geometric(rolled[i, : r.length].numpy(), goals[i]) for i, r in enumerate(real)]
    geo_real = [geometric(r.states[1:], goals[i]) for i, r in enumerate(real)]
    report = {
        "preset": preset, "overrides": extra, "rollouts": len(real), "success_rate": float(label.mean()),
        "hand_error_m": {str(k): at(err, k) for k in (1, 5, 10, 20, 30, 40, 50)},
        "hand_xy_error_m": {str(k): at(xy_err, k) for k in (1, 5, 10, 20, 30, 40, 50)},
        "action_sum_xy_error_m": {str(k): at(ref_err, k) for k in (1, 5, 10, 20, 30, 40, 50)},
        "geometric_success_auc_rolled": success_auc(np.array(geo_rolled), label),
        "geometric_success_auc_real": success_auc(np.array(geo_real), label),
        "head_success_auc_rolled": success_auc(np.array(head_rolled), label),
        "head_success_auc_real_states": success_auc(np.array(head_real), label),
    }  # fmt: skip
    domain.close()
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="vla-rl")
    p.add_argument("--tasks", type=int, default=16, help="real groups")
    p.add_argument("--out", default="benchmarks/results")
    a, extra = p.parse_known_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = measure(a.preset, a.tasks, extra)
    (out / "vla_grounded_state.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
