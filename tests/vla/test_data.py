"""Demonstrations round-trip through lerobot's own dataset class (local root, no hub)."""

from __future__ import annotations

import numpy as np
import pytest

import sims
from wmrl_vla import data

TASK = "wmrl/ReachColor-v0"


def _reference(seed: int, policy=None, max_steps: int = 16):
    env = sims.make(TASK, image_size=32, max_steps=max_steps)
    try:
        frames, info = data.rollout(env, policy or sims.expert_for(env), seed)
    finally:
        env.close()
    return frames, info


def _assert_episode_equals(ep: dict, frames: list, seed: int, task_id: str | None) -> None:
    trans = [f for f in frames if f[1] is not None]
    np.testing.assert_array_equal(ep["image"], np.stack([f[0]["image"] for f in frames]))
    np.testing.assert_array_equal(ep["state"], np.stack([f[0]["state"] for f in frames]))
    np.testing.assert_array_equal(ep["action"], np.stack([f[1] for f in trans]).astype(np.float32))
    np.testing.assert_array_equal(ep["reward"], np.array([f[2] for f in trans], dtype=np.float32))
    np.testing.assert_array_equal(ep["success"], np.array([f[3] for f in trans]))
    assert ep["instruction"] == frames[0][4]
    assert ep["seed"] == seed and ep["task_id"] == task_id
    assert ep["final"] == (frames[-1][1] is None)


def test_record_reload_and_append(tmp_path):
    root = tmp_path / "demos"
    ds = data.record_demos([TASK], 2, root, image_size=32, seed=5, max_steps=16)

    # lerobot's own reader sees what we wrote
    refs = [_reference(5), _reference(6)]
    n_frames = sum(len(f) for f, _ in refs)
    assert ds.meta.total_episodes == 2 and len(ds) == n_frames
    item = ds[0]
    assert tuple(item["observation.image"].shape) == (3, 32, 32)
    assert item["task"] == refs[0][0][0][4]
    assert {"observation.state", "action", "next.reward", "next.success"} <= set(ds.features)

    episodes = data.load_episodes(root)
    assert [e["episode_index"] for e in episodes] == [0, 1]
    for ep, (frames, info), seed in zip(episodes, refs, (5, 6), strict=True):
        _assert_episode_equals(ep, frames, seed, TASK)
        assert ep["success"][-1] == info["success"]
        assert ep["image"].shape[0] == ep["action"].shape[0] + 1  # final observation kept

    # RL anchor rollouts from any policy append in the same format
    rng = np.random.default_rng(0)
    frames, _ = _reference(9, policy=lambda obs, info: rng.uniform(-1, 1, 4).astype(np.float32), max_steps=5)
    total = data.append_episodes(root, "wmrl/demos", [frames], task_ids=[TASK], seeds=[9])
    assert total == 3
    episodes = data.load_episodes(root)
    assert len(episodes) == 3
    _assert_episode_equals(episodes[2], frames, 9, TASK)
    _assert_episode_equals(episodes[0], refs[0][0], 5, TASK)  # earlier episodes untouched


def test_lerobot_takes_no_policy_input_from_the_final_row_flag_and_old_recordings_still_load(
    tmp_path, monkeypatch
):
    """The final-row flag is ``wmrl.final``: lerobot's feature mapping (what ``lerobot-train`` builds a
    policy's inputs from) sees only the image and the state. A dataset recorded under the old name
    ``observation.final`` still loads, and anchor rollouts append to it under that name."""
    from lerobot.utils.feature_utils import dataset_to_policy_features

    ds = data.record_demos([TASK], 1, tmp_path / "new", image_size=32, seed=5, max_steps=16)
    inputs = {k for k, f in dataset_to_policy_features(ds.features).items() if k != "action"}
    assert inputs == {"observation.image", "observation.state"} and "wmrl.final" in ds.features

    with monkeypatch.context() as m:  # a recording made before the rename
        m.setattr(data, "FINAL_KEY", data.LEGACY_FINAL_KEY)
        old = data.record_demos([TASK], 1, tmp_path / "old", image_size=32, seed=5, max_steps=16)
    assert "observation.final" in old.features and "wmrl.final" not in old.features
    frames, _ = _reference(9, max_steps=5)
    assert data.append_episodes(tmp_path / "old", "wmrl/demos", [frames], task_ids=[TASK], seeds=[9]) == 2
    episodes = data.load_episodes(tmp_path / "old")
    _assert_episode_equals(episodes[0], _reference(5)[0], 5, TASK)
    _assert_episode_equals(episodes[1], frames, 9, TASK)


def test_append_rejects_mismatched_shapes(tmp_path):
    frames, _ = _reference(1, max_steps=3)
    root = tmp_path / "ds"
    data.append_episodes(root, "wmrl/x", [frames])
    bad = [({"image": f[0]["image"][:16], "state": f[0]["state"]}, *f[1:]) for f in frames]
    with pytest.raises(ValueError, match="observation.image"):
        data.append_episodes(root, "wmrl/x", [bad])


def test_expert_demos_none_of_which_succeeds_are_an_error(tmp_path):
    """vla-debug's 12 steps cut MetaWorld's reach expert short (it needs ~40-100): 0 of 3 demos
    succeed, which SFT must not learn from."""
    with pytest.raises(
        data.DemoError,
        match=r"^no scripted-expert demo of wmrl/MetaWorld-reach-v3 succeeded \(0 of 3\) within 12 steps "
        r"\(max_steps=12; the task's own limit is 100\), so SFT would learn from failures; raise "
        r"domain.max_steps, or set it to null for each task's own limit$",
    ):
        data.record_demos(["wmrl/MetaWorld-reach-v3"], 3, tmp_path / "d", image_size=32, max_steps=12)


def test_some_failed_expert_demos_are_kept_with_a_warning(caplog):
    data.check_demo_success(TASK, 3, 3, None)
    assert not caplog.records
    with caplog.at_level("WARNING", logger="wmrl"):
        data.check_demo_success(TASK, 2, 3, 12)
    assert caplog.records[0].getMessage() == (
        f"2 of 3 scripted-expert demos of {TASK} succeeded within 12 steps (max_steps=12; the task's own "
        "limit is 50); the failed ones are kept"
    )
    with pytest.raises(data.DemoError, match="within 50 steps, so SFT .*; its expert fails at this horizon"):
        data.check_demo_success(TASK, 0, 3, None)
