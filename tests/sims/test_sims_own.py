"""Behaviour of our own tabletop tasks: the instruction matters, replay is exact, splits hold out."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import sims
from sims.own.base import PALETTE, combo_split, move_toward


def _drive_to(env, xyz, grip=-1.0, steps=25):
    info = None
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(move_toward(env, np.asarray(xyz), grip))
        if terminated or truncated:
            break
    return info


def test_reach_succeeds_only_at_the_named_colour(make):
    env = make("wmrl/ReachColor-v0", render=False, max_steps=200)
    for seed in range(3):
        env.reset(seed=seed)
        p = env.params
        goal = p["goal"]
        other = (goal + 1) % len(p["positions"])
        ox, oy = p["positions"][other]
        _drive_to(env, [ox, oy, 0.1])  # travel high, so as not to brush the goal on the way
        info = _drive_to(env, [ox, oy, 0.01])
        assert not info["success"], "touching a distractor counted as success"
        gx, gy = p["positions"][goal]
        _drive_to(env, [gx, gy, 0.1])
        info = _drive_to(env, [gx, gy, 0.01])
        assert info["success"]


def test_pressing_a_distractor_button_is_not_success(make):
    from sims.own.button import CAP_TOP

    env = make("wmrl/PressButton-v0", render=False, max_steps=200)
    env.reset(seed=2)
    p = env.params
    other = (p["goal"] + 1) % len(p["positions"])
    ox, oy = p["positions"][other]
    _drive_to(env, [ox, oy, CAP_TOP + 0.04])
    info = _drive_to(env, [ox, oy, CAP_TOP - 0.03], grip=1.0, steps=10)
    assert env.depression(other) > 0.014, "the distractor was not pressed"
    assert not info["success"]
    gx, gy = p["positions"][p["goal"]]
    _drive_to(env, [gx, gy, CAP_TOP + 0.04], grip=1.0)
    info = _drive_to(env, [gx, gy, CAP_TOP - 0.03], grip=1.0, steps=10)
    assert info["success"]


def test_push_hand_alone_on_the_zone_is_not_success(make):
    env = make("wmrl/PushColor-v0", render=False, max_steps=200)
    env.reset(seed=5)
    zx, zy = env.params["zones"][env.params["goal_zone"]]
    info = _drive_to(env, [zx, zy, 0.1], steps=15)
    assert not info["success"]


@pytest.mark.parametrize("task_id", sims.OWN_TASKS)
def test_instruction_names_a_colour_drawn_in_the_image(task_id, make):
    env = make(task_id, image_size=64)
    colours_seen = set()
    for seed in range(6):
        obs, info = env.reset(seed=seed)
        colour = next(c for c in PALETTE if f" {c} " in f" {info['instruction']} ")
        colours_seen.add(colour)
        img = obs["image"].astype(float) / 255.0
        # pixels of a saturated surface, labelled with the palette colour of nearest chromaticity
        chroma = img / (img.sum(-1, keepdims=True) + 1e-6)
        palette = np.array([np.array(v) / sum(v) for v in PALETTE.values()])
        nearest = np.linalg.norm(chroma[..., None, :] - palette, axis=-1).argmin(-1)
        saturated = (img.max(-1) - img.min(-1)) > 0.25
        close = saturated & (nearest == list(PALETTE).index(colour))
        assert close.sum() >= 4, f"{colour} not visible for seed {seed}"
    assert len(colours_seen) >= 3, "instructions do not vary across seeds"


@pytest.mark.parametrize("task_id", sims.OWN_TASKS)
def test_expert_progress_rises_to_success(task_id, make):
    env = make(task_id, render=False)
    act = sims.expert_for(env)
    obs, info = env.reset(seed=21)
    progress = [info["progress"]]
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(act(obs, info))
        progress.append(info["progress"])
        done = terminated or truncated
    assert info["success"] and progress[-1] > progress[0] + 0.5


@pytest.mark.parametrize("task_id", sims.OWN_TASKS)
def test_train_and_test_splits_are_disjoint(task_id, make):
    combos = {}
    for split in ("train", "test"):
        env = make(task_id, render=False, split=split)
        combos[split] = set()
        for seed in range(15):
            env.reset(seed=seed)
            c = env.combo_of(env.params)
            assert combo_split(*c) == split
            combos[split].add(c)
    assert combos["train"].isdisjoint(combos["test"])
    assert len(combos["test"]) >= 2


def test_image_size_and_close(make):
    env = make("wmrl/PushColor-v0", image_size=96)
    obs, _ = env.reset(seed=0)
    assert obs["image"].shape == (96, 96, 3)
    env.close()
    assert env._renderer is None
    env.close()  # idempotent


def test_state_is_proprioception_only(make):
    env = make("wmrl/PushColor-v0", render=False)
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs["state"][:3], env.tip_pos(), atol=1e-6)
    assert obs["state"][6] == pytest.approx(1.0)  # starts open
    # moving an object does not change the state vector
    before = obs["state"].copy()
    adr = env.model.jnt_qposadr[env.model.joint("puck0").id]
    env.data.qpos[adr] += 0.05
    np.testing.assert_array_equal(env._state(), before)


def test_an_env_left_open_exits_without_gl_teardown_errors():
    """A script that never calls env.close() must not print tracebacks from renderers freed after
    the interpreter tore OpenGL down."""
    script = (
        "import sims\nfor seed in range(3):\n    env = sims.make('wmrl/ReachColor-v0'); env.reset(seed=seed)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
