"""What a lerobot user runs around `wmrl run`: demos recorded by a command, a dataset written by
lerobot's own API with lerobot's standard columns only, lerobot's evaluation of a folder episode by
episode on WMRL's seeds, and the words a run and its refusals use (wmrl_vla.record_demos,
wmrl_vla.lerobot_eval, wmrl_vla.lerobot_env)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wmrl.cli import main as cli_main

TASK, SIZE, STEPS = "reach-v3", 32, 60  # STEPS: the demos' time limit (the expert needs ~40)
TINY_ACT = dict(
    dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1,
    n_vae_encoder_layers=1, latent_dim=8, chunk_size=1, n_action_steps=1,
)  # fmt: skip


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(dataset root, ACT folder): 2 expert demos recorded by `python -m wmrl_vla.record_demos`'s main,
    and a tiny ACT trained on them 2 steps by lerobot's own training loop."""
    from wmrl_vla.lerobot_policy import train_act
    from wmrl_vla.record_demos import main

    root = tmp_path_factory.mktemp("user_tools")
    argv = ["--task", TASK, "--episodes", "2", "--root", str(root / "data"), "--image-size", str(SIZE),
            "--episode-length", str(STEPS), "--seed", "100", "--repo-id", "user/reach"]  # fmt: skip
    assert main(argv) == 0
    folder = train_act(root / "data", "user/reach", root / "act", steps=2, **TINY_ACT)
    return root / "data", folder


def test_record_demos_command_writes_the_dataset_lerobot_trains_on(recorded, capsys, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from wmrl_vla.record_demos import main

    data, folder = recorded
    ds = LeRobotDataset("user/reach", root=data)
    assert ds.meta.total_episodes == 2 and ds.features["observation.image"]["shape"] == (SIZE, SIZE, 3)
    assert {"next.reward", "next.success", "next.done", "task"} <= set(ds.features) | {"task"}
    assert (folder / "config.json").is_file()  # lerobot's training loop took it as it is
    # bad input: one line, nothing written
    assert main(["--task", "reach-v9", "--episodes", "1", "--root", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --task 'reach-v9' is not a lerobot MetaWorld task; close: reach-v3")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def _lerobot_recording(root: Path, episodes: int = 2, steps: int = 6) -> list[dict]:
    """A dataset written as a lerobot user writes one (LeRobotDataset.create / add_frame /
    save_episode / finalize) with lerobot's standard feature names only, in lerobot's MetaWorld env
    with its own reward (MetaWorld's, in [0, 10]) and success; returns each episode's raw values."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from wmrl_vla.lerobot_env import lerobot_metaworld_env

    features = {
        "observation.image": {"dtype": "image", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (4,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }  # fmt: skip
    ds = LeRobotDataset.create("user/own", fps=80, features=features, root=root, use_videos=False)
    env = lerobot_metaworld_env(TASK, SIZE, steps)
    rng = np.random.default_rng(0)
    raw = []
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        rewards, successes = [], []
        for t in range(steps):
            action = rng.uniform(-1, 1, 4).astype(np.float32)
            nxt, reward, term, trunc, info = env.step(action)
            success = bool(info["is_success"]) or t == 3  # one success mid-episode: sticky for the WM
            ds.add_frame({"observation.image": obs["pixels"], "observation.state": obs["agent_pos"].astype(np.float32),
                          "action": action, "next.reward": np.array([reward], np.float32),
                          "next.success": np.array([success]), "next.done": np.array([t == steps - 1]),
                          "task": env.task_description})  # fmt: skip
            rewards.append(reward)
            successes.append(success)
            obs = nxt
        ds.save_episode()
        raw.append({"reward": np.array(rewards, np.float32), "success": np.array(successes)})
    env.close()
    ds.finalize()
    return raw


def test_a_dataset_written_by_lerobots_api_pretrains_the_world_model(tmp_path, caplog):
    """No wmrl.final, no env.seed: accepted by the config, read with lerobot's reward made WMRL's
    (MetaWorld's / 10, 1 once successful) and success sticky, what is lost logged, and the world
    model trains on it."""
    import torch

    from wmrl.config import load_config
    from wmrl_vla.lerobot_env import load_dataset
    from world_models.vla_dynamics import (
        VLADynamics,
        VLADynamicsConfig,
        episodes_from_records,
        train_dynamics,
    )

    root = tmp_path / "own"
    raw = _lerobot_recording(root)
    cfg = load_config("vla-debug", [f"--out_dir={tmp_path / 'run'}", "--domain.env.type=metaworld",
                                    f"--domain.env.task={TASK}", f"--domain.image_size={SIZE}",
                                    f"--domain.dataset_root={root}"])  # fmt: skip
    assert cfg.domain.dataset_root == str(root)
    with caplog.at_level("WARNING", logger="wmrl"):
        episodes = load_dataset(root, "metaworld")
    lost = " ".join(r.getMessage() for r in caplog.records)
    assert "has no wmrl.final column" in lost and "has no env.seed column" in lost
    assert len(episodes) == 2
    for e, r in zip(episodes, raw, strict=True):
        assert len(e["image"]) == len(e["action"]) == len(r["reward"]) and e["seed"] == -1 and not e["final"]
        assert r["reward"].max() > 1  # MetaWorld's own scale
        sticky = np.maximum.accumulate(r["success"])
        np.testing.assert_array_equal(e["success"], sticky)
        want = np.where(sticky, 1.0, np.clip(r["reward"] / 10, 0, 1))
        np.testing.assert_allclose(e["reward"], want, atol=1e-6)
    torch.manual_seed(0)
    wm = VLADynamics(
        VLADynamicsConfig(image_size=SIZE, state_dim=4, action_dim=4, latent_dim=16, n_members=1)
    )
    _, hist = train_dynamics(wm, episodes_from_records(episodes), steps=2, batch_size=2, horizon=4, lr=1e-3,
                             seed=0)  # fmt: skip
    assert len(hist) == 2 and np.isfinite(hist).all()
    # without that env's conversion, rewards outside [0, 1] are refused in one line
    with pytest.raises(
        ValueError,
        match=r"has next.reward in \[[0-9.]+, [0-9.]+\]; the world model reads rewards in \[0, 1\]",
    ):
        load_dataset(root)


def test_a_dataset_without_rewards_is_refused_in_one_line(tmp_path, capsys):
    info = tmp_path / "noreward" / "meta" / "info.json"
    info.parent.mkdir(parents=True)
    info.write_text(
        json.dumps({"features": {k: {} for k in ("observation.image", "observation.state", "action")}})
    )
    base = ["run", "vla-debug", "--out-dir", str(tmp_path / "run"), "--domain.env.type=metaworld",
            f"--domain.env.task={TASK}", f"--domain.image_size={SIZE}"]  # fmt: skip
    assert cli_main([*base, f"--domain.dataset_root={info.parent.parent}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "lacks next.reward, next.success: the world model learns" in err and len(err.splitlines()) == 1


def test_pusht_and_aloha_refusals_say_what_is_true(tmp_path, capsys):
    for kind, what in (("pusht", "lerobot[pusht]"), ("aloha", "lerobot[aloha]")):
        argv = ["run", "vla-debug", "--out-dir", str(tmp_path / "run"), f"--domain.env.type={kind}",
                "--domain.env.task=x"]  # fmt: skip
        assert cli_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert what in err and "uv.lock" in err and "LIBERO" not in err and len(err.splitlines()) == 1, err


def test_a_run_on_the_users_policy_records_its_kind_and_calls_it_theirs(recorded, tmp_path, capsys):
    from wmrl.config import load_config, to_dict
    from wmrl_vla.pipeline import policy_words

    folder = recorded[1]
    base = [f"--out_dir={tmp_path / 'run'}", "--domain.env.type=metaworld", f"--domain.env.task={TASK}",
            f"--domain.image_size={SIZE}", f"--domain.policy_path={folder}"]  # fmt: skip
    cfg = load_config("vla-debug", base)
    assert to_dict(cfg)["domain"]["policy"] == "lerobot_act"  # config.yaml: the kind post-trained
    words = policy_words(cfg.domain)
    assert words.startswith("your policy") and "SFT" not in words
    assert policy_words(load_config("vla-debug", [f"--out_dir={tmp_path / 'r2'}"]).domain) == "the SFT policy"
    argv = [
        "run",
        "vla-debug",
        "--out-dir",
        str(tmp_path / "r3"),
        *base[1:],
        "--domain.policy=lerobot_smolvla",
    ]
    assert cli_main(argv) == 2
    assert "holds a 'act' policy; drop domain.policy" in capsys.readouterr().err


def test_lerobot_eval_command_writes_per_episode_success_on_wmrls_seeds(recorded, tmp_path, capsys):
    """lerobot's eval_policy at the policy's own 32 px on WMRL's evaluation seeds, per episode with its
    seed, equal to WMRL's own greedy rollouts of the folder (n_action_steps 1) on the same seeds."""
    from wmrl_vla.lerobot_eval import main

    folder = recorded[1]
    out = tmp_path / "episodes.json"
    argv = ["--policy", str(folder), "--task", TASK, "--episode-length", "5", "--episodes", "2", "--out", str(out),
            "--wmrl"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(out.read_text())
    assert got["env"]["image_size"] == SIZE and got["evaluator"].endswith("eval_policy")
    assert [e["seed"] for e in got["per_episode"]] == [1_000_000, 1_007_919]
    for e in got["per_episode"]:
        assert e["wmrl_success"] == e["success"]
        assert (
            e["max_reward"] / 10 == pytest.approx(min(1.0, e["wmrl_max_progress"]), abs=1e-5) or e["success"]
        )
    assert main([*argv[:-3], "--seeds", "1000000", "--out", str(tmp_path / "e.csv")]) == 0
    lines = (tmp_path / "e.csv").read_text().splitlines()
    assert lines[0] == "seed,success,sum_reward,max_reward" and lines[1].startswith("1000000,")
    capsys.readouterr()
    assert main(["--policy", str(folder), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a WMRL export of a lerobot env run: give --task" in err and len(err.splitlines()) == 1


def test_helpers_choose_mujoco_gl_before_mujoco_loads(monkeypatch):
    """Each helper and command calls the function `wmrl run` sets MUJOCO_GL with (sims._gl), before
    MuJoCo would load: here MuJoCo is made to look not loaded yet and MUJOCO_GL unset."""
    import sims._gl
    from wmrl_vla import lerobot_eval, record_demos
    from wmrl_vla.lerobot_env import lerobot_metaworld_env

    calls = []
    real = sims._gl.select_backend
    monkeypatch.setattr(sims._gl, "select_backend", lambda: calls.append(1) or real())
    for k in ("MUJOCO_GL", "DISPLAY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delitem(sys.modules, "mujoco")
    env = lerobot_metaworld_env(TASK, 16, 2)
    env.close()
    assert calls and os.environ.get("MUJOCO_GL") == "egl"
    for mod in (record_demos, lerobot_eval):  # each command chooses it first, even on bad input
        n = len(calls)
        with pytest.raises(SystemExit):
            mod.main(["--help"])
        assert len(calls) == n + 1


@pytest.mark.slow
def test_helpers_set_mujoco_gl_as_wmrl_run_does(tmp_path):
    """lerobot's MetaWorld env built by WMRL's helper in a fresh process with no MUJOCO_GL and no
    display renders (MuJoCo's default, glfw, would fail headless)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    code = ("import os; from wmrl_vla.lerobot_env import lerobot_metaworld_env; "
            "e = lerobot_metaworld_env('reach-v3', 16, 2); o, _ = e.reset(seed=0); "
            "print(os.environ['MUJOCO_GL'], o['pixels'].shape)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "egl (16, 16, 3)"


def test_lerobot_eval_command_reads_an_exports_run_settings(recorded, tmp_path, capsys):
    """A folder with a WMRL export's manifest: task, episode length and episodes come from its
    `evaluation`; a manifest whose image size disagrees with config.json is refused in one line."""
    import shutil

    from wmrl_vla.lerobot_eval import main

    export = tmp_path / "export"
    shutil.copytree(recorded[1], export)
    evaluation = {
        "env_type": "metaworld",
        "task": TASK,
        "image_size": SIZE,
        "episode_length": 3,
        "episodes": 1,
    }
    (export / "wmrl_export.json").write_text(json.dumps({"evaluation": evaluation}))
    assert main(["--policy", str(export), "--out", str(tmp_path / "e.json")]) == 0
    got = json.loads((tmp_path / "e.json").read_text())
    assert got["env"] == {"type": "metaworld", "task": TASK, "image_size": SIZE, "episode_length": 3}
    assert [e["seed"] for e in got["per_episode"]] == [1_000_000] and got["seeds"].startswith("WMRL's")
    (export / "wmrl_export.json").write_text(json.dumps({"evaluation": {**evaluation, "image_size": 64}}))
    capsys.readouterr()
    assert main(["--policy", str(export), "--out", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("config.json says 32 px, the export 64") and len(err.splitlines()) == 1
