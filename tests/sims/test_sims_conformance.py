"""Conformance of every registered task to the shared interface (as dm_control's suite tests do)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import sims

ALL = sims.list_tasks()
RENDER_REPLAY = {*sims.OWN_TASKS, "wmrl/MetaWorld-push-v3", "wmrl/DMC-reacher-easy-v0"}
INFO_KEYS = {"instruction": str, "success": bool, "progress": float, "task_id": str, "step": int}


def _random_actions(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, dim)).astype(np.float32)


def test_registry_covers_the_three_sources():
    sources = {sims.task_info(t)["source"] for t in ALL}
    assert sources == {"own", "metaworld", "dm_control"}
    assert len(sims.OWN_TASKS) >= 3 and set(sims.OWN_TASKS) <= set(ALL)
    mt10 = {
        "reach",
        "push",
        "pick-place",
        "door-open",
        "drawer-open",
        "drawer-close",
        "button-press-topdown",
        "peg-insert-side",
        "window-open",
        "window-close",
    }
    assert {f"wmrl/MetaWorld-{n}-v3" for n in mt10} <= set(ALL)
    # own and MetaWorld tasks share one action/state layout, so one policy can serve them all
    shared = [t for t in ALL if sims.task_info(t)["source"] != "dm_control"]
    assert {(sims.task_info(t)["action_dim"], sims.task_info(t)["state_dim"]) for t in shared} == {(4, 7)}


def test_task_lines_one_per_task_with_columns():
    lines = sims.task_lines()
    assert [line.split("\t")[0] for line in lines] == ALL
    for line in lines:
        tid, source, adim, steps, expert, instr = line.split("\t")
        assert source == sims.task_info(tid)["source"] and int(adim) == sims.task_info(tid)["action_dim"]
        assert steps == f"{sims.task_info(tid)['max_steps']} steps"
        assert expert == ("expert" if sims.task_info(tid)["has_expert"] else "no expert")
        assert instr


def test_unknown_task_lists_known_ones():
    with pytest.raises(KeyError, match="wmrl/PushColor-v0"):
        sims.make("wmrl/NoSuchTask-v0")


def test_gym_make_builds_registered_ids():
    env = gym.make("wmrl/ReachColor-v0", image_size=32)
    obs, info = env.reset(seed=1)
    assert obs["image"].shape == (32, 32, 3) and info["instruction"]
    env.close()


@pytest.mark.parametrize("task_id", ALL)
def test_spaces_rewards_and_info(task_id, make):
    ti = sims.task_info(task_id)
    env = make(task_id, image_size=24, seed=0)
    assert env.action_space.shape == (ti["action_dim"],)
    assert np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)
    assert env.observation_space["state"].shape == (ti["state_dim"],)
    assert env.max_steps == ti["max_steps"]
    obs, info = env.reset()
    assert env.observation_space.contains(obs)
    assert obs["image"].dtype == np.uint8 and obs["image"].shape == (24, 24, 3)
    assert obs["image"].std() > 5, "the camera sees a blank frame"
    assert obs["state"].dtype == np.float32
    for key, typ in INFO_KEYS.items():
        assert isinstance(info[key], typ), key
    assert info["task_id"] == task_id and info["instruction"] and info["step"] == 0
    for t, a in enumerate(_random_actions(3, ti["action_dim"])):
        obs, reward, terminated, truncated, info = env.step(a)
        assert env.observation_space.contains(obs)
        assert 0.0 <= reward <= 1.0 and 0.0 <= info["progress"] <= 1.0
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
        assert info["step"] == t + 1


@pytest.mark.parametrize("task_id", ALL)
def test_deterministic_under_seed(task_id, make):
    ti = sims.task_info(task_id)
    actions = _random_actions(6, ti["action_dim"], seed=3)
    a, b = make(task_id, render=False), make(task_id, render=False)
    runs = []
    for env in (a, b, a):  # two envs, and the same env again after another episode
        obs, info = env.reset(seed=11)
        traj = [obs["state"]]
        for act in actions:
            obs, r, *_ = env.step(act)
            traj += [obs["state"], np.float64(r)]
        runs.append((info["instruction"], traj))
        env.reset(seed=12)
    for instr, traj in runs[1:]:
        assert instr == runs[0][0]
        for x, y in zip(traj, runs[0][1], strict=True):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(runs[0][1][0], runs[0][1][-2]), "actions did not move the robot"


@pytest.mark.parametrize("task_id", ALL)
def test_initial_image_randomised_across_seeds_and_repeatable(task_id, make):
    env = make(task_id, image_size=24)
    starts = [env.reset(seed=s)[0]["image"] for s in range(4)]
    assert len({im.tobytes() for im in starts}) == 4, "initial states are not randomised across seeds"
    np.testing.assert_array_equal(env.reset(seed=0)[0]["image"], starts[0])


@pytest.mark.parametrize("task_id", ALL)
def test_time_limit_truncates(task_id, make):
    env = make(task_id, render=False, split="train")  # every task takes a split
    env.reset(seed=3)
    zero = np.zeros(env.action_space.shape, dtype=np.float32)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(zero)
        steps += 1
    assert terminated == info["success"]
    assert truncated == (not terminated) and (terminated or steps == env.max_steps)
    with pytest.raises(RuntimeError):
        make(task_id, render=False).step(zero)  # stepping before reset is an error


@pytest.mark.parametrize("task_id", ALL)
def test_sim_state_replays_exactly(task_id, make):
    ti = sims.task_info(task_id)
    # images too where rendering is cheap, and for one task of each third-party source
    kw = {"image_size": 16, "terminate_on_success": False, "render": task_id in RENDER_REPLAY}
    env = make(task_id, **kw)
    env.reset(seed=4)
    for a in _random_actions(3, ti["action_dim"], seed=1):
        env.step(a)
    snap = env.get_sim_state()
    actions = _random_actions(3, ti["action_dim"], seed=2)
    first = [env.step(a) for a in actions]
    other = make(task_id, **kw)
    other.reset(seed=999)  # a different episode, then overwritten
    other.set_sim_state(snap)
    second = [other.step(a) for a in actions]
    for (o1, r1, *_, i1), (o2, r2, *_, i2) in zip(first, second, strict=True):
        np.testing.assert_array_equal(o1["image"], o2["image"])
        np.testing.assert_array_equal(o1["state"], o2["state"])
        assert r1 == r2 and i1 == i2
    with pytest.raises(ValueError):
        make(ALL[0] if task_id != ALL[0] else ALL[1], render=False).set_sim_state(snap)


@pytest.mark.filterwarnings("ignore")  # it warns that unbounded state spaces are unbounded
@pytest.mark.parametrize("task_id", sorted(RENDER_REPLAY))
def test_gymnasium_env_checker_passes(task_id, make):
    from gymnasium.utils.env_checker import check_env

    check_env(make(task_id, image_size=16), skip_render_check=False)


def _episode_success(env, act, seed: int) -> bool:
    obs, info = env.reset(seed=seed)
    for _ in range(env.max_steps):
        obs, reward, terminated, truncated, info = env.step(act(obs, info))
        if terminated or truncated:
            break
    if info["success"]:
        assert reward == 1.0 and terminated
    return info["success"]


@pytest.mark.parametrize("task_id", sims.OWN_TASKS)
def test_own_expert_succeeds_on_nearly_every_seed(task_id, make):
    env = make(task_id, render=False)
    act = sims.expert_for(env)
    wins = sum(_episode_success(env, act, s) for s in range(100, 110))
    assert wins >= 9, f"{task_id}: expert succeeded on {wins}/10 seeds"


@pytest.mark.parametrize("task_id", [t for t in ALL if sims.task_info(t)["source"] != "own"])
def test_third_party_expert_succeeds_or_is_declared_absent(task_id, make):
    env = make(task_id, render=False)
    if not sims.task_info(task_id)["has_expert"]:
        with pytest.raises(KeyError):
            sims.expert(task_id)
        return
    act = sims.expert_for(env)
    wins = sum(_episode_success(env, act, s) for s in range(2))
    assert wins == 2, f"{task_id}: expert succeeded on {wins}/2 seeds"
