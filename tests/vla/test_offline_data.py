"""The policy-diverse offline dataset for the world model (wmrl_vla/offline_data.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import sims
from wmrl.config import ConfigError
from wmrl_vla.config import VLAConfig
from wmrl_vla.data import load_episodes
from wmrl_vla.offline_data import (
    OFFLINE_REPO,
    OFFLINE_SEED0,
    Source,
    deal_seeds,
    parse_mix,
    perturbed_copy,
    record_offline,
)
from wmrl_vla.policy import SmallVLA, SmallVLAConfig
from wmrl_vla.rollout import EnvPool, replay, replay_reward, run_expert_episodes

TASK = "wmrl/ReachColor-v0"


def test_a_mix_parses_and_a_bad_entry_is_named():
    assert parse_mix(["expert:0.3", "policy:1.5", "perturbed:0.05"]) == [
        Source("expert", 0.3), Source("policy", 1.5), Source("perturbed", 0.05)
    ]  # fmt: skip
    for bad in ("expert", "teacher:0.1", "policy:hot", "expert:-1", "policy:nan"):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_mix([bad])
    with pytest.raises(ValueError, match="no source"):
        parse_mix([])
    with pytest.raises(ConfigError, match=r"domain.wm_offline_mix: 'teacher:0.1' is not a source"):
        VLAConfig(tasks=[TASK], wm_offline_mix=["teacher:0.1"])
    with pytest.raises(ConfigError, match="wm_offline_per_task=-1"):
        VLAConfig(tasks=[TASK], wm_offline_per_task=-1)


def test_episodes_are_dealt_round_robin_on_distinct_seeds():
    specs = deal_seeds(["a", "b"], 5, 3)
    assert specs == [
        [("a", OFFLINE_SEED0), ("a", OFFLINE_SEED0 + 3), ("b", OFFLINE_SEED0), ("b", OFFLINE_SEED0 + 3)],
        [("a", OFFLINE_SEED0 + 1), ("a", OFFLINE_SEED0 + 4), ("b", OFFLINE_SEED0 + 1), ("b", OFFLINE_SEED0 + 4)],
        [("a", OFFLINE_SEED0 + 2), ("b", OFFLINE_SEED0 + 2)],
    ]  # fmt: skip


def test_a_perturbed_copy_moves_each_weight_by_its_scale_and_leaves_the_policy():
    torch.manual_seed(0)
    pol = SmallVLA(SmallVLAConfig(image_size=32, d_model=32, n_layers=1))
    before = {k: v.clone() for k, v in pol.state_dict().items()}
    a, b = perturbed_copy(pol, 0.1, seed=3), perturbed_copy(pol, 0.1, seed=3)
    for k, v in pol.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)  # the original is untouched
    moved = 0
    with torch.no_grad():
        for (name, p), q, r in zip(pol.named_parameters(), a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(q, r, rtol=0, atol=0)  # seeded
            if p.numel() > 1 and p.std() > 0:  # (a zero-initialised tensor has no scale to move by)
                assert not torch.equal(p, q), name
            if p.numel() >= 256 and p.std() > 0:  # enough entries for the sample std to be tight
                ratio = float((q - p).std() / p.std())
                assert 0.08 < ratio < 0.12, (name, ratio)  # alpha * std(w) * N(0, 1), alpha = 0.1
                moved += 1
    assert moved > 5


def test_noisy_expert_actions_differ_from_the_expert_and_are_the_ones_executed():
    pool = EnvPool(32, max_steps=30)
    try:
        clean = run_expert_episodes([(TASK, 11)], pool)[0]
        noisy = run_expert_episodes([(TASK, 11)], pool, action_noise=0.5, rng=np.random.default_rng(0))[0]
    finally:
        pool.close()
    n = min(clean.length, noisy.length)
    assert np.abs(noisy.actions[:n] - clean.actions[:n]).mean() > 0.1
    assert noisy.actions.min() >= -1 and noisy.actions.max() <= 1
    # the recorded actions replayed from the seed give the recorded reward: they are what was executed
    assert replay_reward(TASK, 11, "train", noisy.actions, max_steps=30) == pytest.approx(noisy.reward)
    prog, succ = replay(TASK, 11, "train", noisy.actions, max_steps=30)  # and step by step
    np.testing.assert_allclose(prog, noisy.progress, atol=1e-6)
    np.testing.assert_array_equal(succ, noisy.success)
    # a prefix executes only its own steps
    prog, succ = replay(TASK, 11, "train", noisy.actions[:5], max_steps=30)
    np.testing.assert_allclose(prog, noisy.progress[:5], atol=1e-6)
    with pytest.raises(ValueError, match="needs an rng"):
        run_expert_episodes([(TASK, 11)], EnvPool(32, 30), action_noise=0.5)


def test_record_offline_writes_every_source_as_one_lerobot_dataset(tmp_path):
    torch.manual_seed(0)
    pol = SmallVLA(
        SmallVLAConfig(image_size=32, d_model=32, n_layers=1, state_dim=sims.task_info(TASK)["state_dim"])
    ).eval()
    mix = ["expert:0.2", "policy:1.5", "perturbed:0.1"]
    summary = record_offline(pol, [TASK], 4, mix, tmp_path / "off", 32, max_steps=12, seed=0, progress=False)
    assert summary["executions"] == 4
    assert [s["episodes"] for s in summary["sources"].values()] == [2, 1, 1]
    assert list(summary["sources"]) == mix
    assert json.loads((tmp_path / "off" / "summary.json").read_text()) == summary
    eps = load_episodes(tmp_path / "off", OFFLINE_REPO)
    assert sorted(int(e["seed"]) for e in eps) == [OFFLINE_SEED0 + k for k in range(4)]
    assert summary["sim_steps"] == sum(len(e["action"]) for e in eps)
    assert all(e["task_id"] == TASK and e["image"].shape[1:] == (32, 32, 3) for e in eps)
