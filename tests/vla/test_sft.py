import numpy as np
import pytest
import torch

from wmrl_vla.policy import SmallVLA, SmallVLAConfig, actions_to_bins
from wmrl_vla.rollout import EnvPool, run_expert_episodes
from wmrl_vla.sft import SFTConfig, flatten_demos, random_shift, sft


@pytest.fixture(scope="module")
def demos():
    pool = EnvPool(32, max_steps=15)
    eps = run_expert_episodes([("wmrl/ReachColor-v0", s) for s in range(4)], pool)
    pool.close()
    return [e.as_record() for e in eps]


def _policy():
    torch.manual_seed(0)
    return SmallVLA(
        SmallVLAConfig(image_size=32, state_dim=7, action_dim=4, n_bins=11, d_model=32, n_layers=1)
    )


def test_flatten_demos_bins_the_expert_actions(demos):
    pol = _policy()
    data = flatten_demos(demos, pol)
    n = sum(len(d["action"]) for d in demos)
    assert data["images"].shape == (n, 3, 32, 32) and data["images"].dtype == torch.uint8
    assert data["instr"].shape == (n, pol.cfg.max_words)
    first = torch.as_tensor(np.asarray(demos[0]["action"]))
    assert torch.equal(data["bins"][: len(first)], actions_to_bins(first, 11))
    with pytest.raises(ValueError):
        flatten_demos([], pol)


def test_sft_fits_the_demos(demos):
    pol = _policy()
    hist = sft(pol, demos, SFTConfig(epochs=8, batch_size=16, lr=3e-3), progress=False)
    assert hist["loss"][-1] < 0.7 * hist["loss"][0]
    assert hist["accuracy"][-1] > hist["accuracy"][0]
    assert not pol.training


def test_random_shift_moves_pixels_but_keeps_shape():
    img = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    img[:, :, 3, 3] = 255
    out = random_shift(img, 2, torch.Generator().manual_seed(0))
    assert out.shape == img.shape and out.dtype == torch.uint8
    assert (out == 255).sum() >= 3  # the bright pixel survives somewhere in each image
    assert torch.equal(random_shift(img, 0, torch.Generator()), img)


def test_sft_aux_goal_trains_and_leaves_no_hook(demos):
    pol = _policy()
    hist = sft(pol, demos, SFTConfig(epochs=2, batch_size=16, shift=2, aux_goal=1.0), progress=False)
    assert np.isfinite(hist["loss"]).all()
    assert not pol.image_enc._forward_hooks
    data = flatten_demos(demos, pol)
    last = np.asarray(demos[0]["observation.state"])[-1, :2]
    assert np.allclose(data["goal"][0].numpy(), last)


def test_dagger_records_label_policy_states_with_the_expert():
    from wmrl_vla.demos import dagger_records

    recs = dagger_records(_policy(), ["wmrl/ReachColor-v0"], 2, 32, seed0=7, max_steps=6)
    assert len(recs) == 2
    for r in recs:
        t = len(r["action"])
        assert 1 <= t <= 6
        assert r["observation.image"].shape == (t, 32, 32, 3)
        assert r["observation.state"].shape == (t, 7) and len(r["next.success"]) == t
        assert np.abs(r["action"]).max() <= 1.0 and isinstance(r["instruction"], str)
    assert np.isfinite(flatten_demos(recs, _policy())["bins"].numpy()).all()


def test_target_labels_point_at_the_named_object():
    import sims
    from sims.own.base import PALETTE
    from wmrl_vla.demos import label_goals, target_labels

    env = sims.make("wmrl/ReachColor-v0", image_size=64)
    try:
        for seed in range(3):
            obs, info = env.reset(seed=seed)
            xy, px = target_labels(env)
            assert np.allclose(xy, env.unwrapped.privileged()["goal"][:2])
            col, row = np.clip(np.round((px + 1) / 2 * 64 - 0.5).astype(int), 0, 63)
            patch = obs["image"][max(row - 1, 0) : row + 2, max(col - 1, 0) : col + 2].reshape(-1, 3) / 255.0
            colour = next(c for c in PALETTE if f" {c} " in f" {info['instruction']} ")
            # some pixel within one of the label is (shaded) the named colour, far from the others
            dist = {c: np.abs(patch - np.array(v)).sum(-1).min() for c, v in PALETTE.items()}
            assert min(dist, key=dist.get) == colour, (seed, info["instruction"], dist)
    finally:
        env.close()
    recs = label_goals([{"task_id": "wmrl/ReachColor-v0", "seed": 1}, {"task_id": None}])
    env = sims.make("wmrl/ReachColor-v0", render=False)
    env.reset(seed=1)
    assert np.allclose(recs[0]["goal"], env.unwrapped.privileged()["goal"][:2]) and "goal" not in recs[1]
    env.close()


def test_sft_trains_the_locator_on_goal_labels(demos):
    from wmrl_vla.demos import label_goals

    recs = label_goals(
        [{**d, "task_id": "wmrl/ReachColor-v0", "seed": s} for s, d in enumerate(demos)], split="train"
    )
    pol = _policy()
    assert pol.locator is not None
    data = flatten_demos(recs, pol)
    assert torch.isfinite(data["goal_px"]).all() and data["goal_px"].abs().max() <= 1
    hist = sft(pol, recs, SFTConfig(epochs=12, batch_size=16, lr=3e-3, aux_goal=1.0), progress=False)
    assert hist["goal_error"][-1] < 0.7 * hist["goal_error"][0]
    assert not pol.locator._forward_hooks
