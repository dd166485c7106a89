"""WMRL as a post-training step of the lerobot workflow (wmrl_vla.lerobot_policy, wmrl_vla.lerobot_env).

The fixture is what a lerobot user brings: a LeRobotDataset recorded in lerobot's MetaWorld env and a
tiny ACT trained on it by lerobot's own training loop, saved as its ``pretrained_model`` folder.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wmrl.cli import main as cli_main

TASK, SIZE, STEPS, RUN_STEPS = "reach-v3", 32, 60, 20  # RUN_STEPS: episodes of the wmrl runs
TINY_ACT = dict(
    dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1,
    n_vae_encoder_layers=1, latent_dim=8, chunk_size=5, n_action_steps=5,
)  # fmt: skip


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    """(dataset root, images, states, instructions): 3 expert episodes in lerobot's MetaWorld env."""
    from wmrl_vla.data import record_demos
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task

    root = tmp_path_factory.mktemp("lerobot_user")
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=TASK, episode_length=STEPS))
    ds = record_demos([task_id], 3, root / "data", "user/reach", image_size=SIZE, seed=100, max_steps=STEPS)
    frames = [ds[i] for i in range(0, ds.num_frames, 20)]
    images = torch.stack([(f["observation.image"] * 255).round().to(torch.uint8) for f in frames])
    states = torch.stack([f["observation.state"] for f in frames])
    return root, images, states, [f["task"] for f in frames]


@pytest.fixture(scope="module")
def user_act(user_data):
    """(pretrained_model folder, dataset root, images, states): ACT trained 4 steps by lerobot."""
    from wmrl_vla.lerobot_policy import train_act

    root, images, states, _ = user_data
    folder = train_act(root / "data", "user/reach", root / "train_act", steps=4, **TINY_ACT)
    return folder, root, images, states


@pytest.fixture(scope="module")
def user_smolvla(user_data):
    """(pretrained_model folder, dataset root, images, states): a tiny SmolVLA trained 2 steps by
    lerobot's own loop, its VLM backbone a tiny SmolVLM written offline (config, tokenizer trained on
    the task's instruction, processor) as :mod:`wmrl_vla.smolvla_bridge` writes it."""
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

    from wmrl_vla.lerobot_policy import train_lerobot_policy
    from wmrl_vla.smolvla_bridge import SmolVLABridgeConfig, train_instruction_tokenizer, write_local_smolvlm

    root, images, states, texts = user_data
    vlm = write_local_smolvlm(
        SmolVLABridgeConfig(image_size=SIZE, vlm_cache_dir=str(root / "vlm")),
        train_instruction_tokenizer(sorted(set(texts))),
    )
    config = SmolVLAConfig(
        chunk_size=5, n_action_steps=5,
        max_state_dim=4, max_action_dim=4, resize_imgs_with_padding=(SIZE, SIZE), tokenizer_max_length=16,
        num_steps=4, vlm_model_name=str(vlm), load_vlm_weights=False, train_expert_only=False,
        freeze_vision_encoder=False, num_vlm_layers=2, expert_width_multiplier=0.75, device="cpu",
        push_to_hub=False,
    )  # fmt: skip
    folder = train_lerobot_policy(config, root / "data", "user/reach", root / "train_smolvla", steps=2)
    return folder, root, images, states


def lerobot_first_action(folder, images, states, texts) -> torch.Tensor:
    """``[B, A]``: lerobot's own inference on a policy folder (its loaders, processors and
    ``select_action``), SmolVLA's flow integrated from noise 0."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    kind = PreTrainedConfig.from_pretrained(str(folder)).type
    lr = get_policy_class(kind).from_pretrained(str(folder)).eval()
    pre, post = make_pre_post_processors(lr.config, pretrained_path=str(folder))
    lr.reset()
    batch = pre({"observation.image": images.float() / 255, "observation.state": states, "task": texts})
    noise = {}
    if kind == "smolvla":
        noise["noise"] = torch.zeros(len(images), lr.config.chunk_size, lr.config.max_action_dim)
    with torch.no_grad():
        return post(lr.select_action(batch, **noise))


def test_pretrained_act_acts_as_lerobot_runs_it(user_act):
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

    folder, _, images, states = user_act
    policy = PretrainedLeRobotPolicy(folder)
    with torch.no_grad():
        mean = policy.step_mean(images, states)
    # lerobot's own inference path: its loaders, processors and select_action (first of the chunk)
    lr = ACTPolicy.from_pretrained(str(folder)).eval()
    pre, post = make_pre_post_processors(lr.config, pretrained_path=str(folder))
    lr.reset()
    with torch.no_grad():
        want = post(
            lr.select_action(pre({"observation.image": images.float() / 255, "observation.state": states}))
        )
        unprocessed = lr.model({"observation.state": states, "observation.images": [images.float() / 255]})[
            0
        ][:, 0]
    assert torch.allclose(mean, want, atol=1e-6, rtol=0), (mean - want).abs().max()
    assert not torch.allclose(mean, unprocessed, atol=1e-3)  # the dataset's normalisation is applied
    assert policy.lerobot_policy.config.n_action_steps == 1 and lr.config.n_action_steps == 5
    # lerobot took the policy's inputs from the recording as lerobot-train does: no bookkeeping column
    assert set(lr.config.input_features) == {"observation.image", "observation.state"}


def test_gaussian_log_probs_flow_into_act_and_log_std(user_act):
    from wmrl_vla.lerobot_bridge import gaussian_log_prob
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

    folder, _, images, states = user_act
    policy = PretrainedLeRobotPolicy(folder)
    n, a = 2, 4
    _, lp, actions = policy.act(images[:n], states[:n], None, generator=torch.Generator().manual_seed(0))
    batch = SimpleNamespace(
        extras={"images": images[:n, None], "states": states[:n, None], "actions": actions[:, None]},
        mask=torch.ones(n, a),
    )
    got = policy.log_probs(batch)  # [N, T*A]
    with torch.no_grad():
        mu = policy.step_mean(images[:n], states[:n])
    want = gaussian_log_prob(actions, mu, policy.clamped_log_std().expand_as(mu))
    assert torch.allclose(got.detach(), want, atol=1e-5) and torch.allclose(lp, want, atol=1e-5)
    got.sum().backward()
    assert policy.log_std.grad.abs().sum() > 0
    assert policy.lerobot_policy.model.action_head.weight.grad.abs().sum() > 0


def test_pretrained_smolvla_acts_as_lerobot_runs_it_from_zero_noise(user_smolvla, user_data):
    """The user's SmolVLA: WMRL's mean is lerobot's own select_action from noise 0 (its processors,
    its tokenizer step), the instruction changes it, and GRPO's log-probs reach SmolVLA's weights."""
    from wmrl_vla.lerobot_bridge import gaussian_log_prob
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

    folder, _, images, states = user_smolvla
    texts = user_data[3]
    policy = PretrainedLeRobotPolicy(folder)
    ids = policy.tokenizer.encode(texts)
    assert ids.shape == (len(texts), 16) and policy.uses_instr
    with torch.no_grad():
        mean = policy.step_mean(images, states, ids)
        other = policy.step_mean(images, states, policy.tokenizer.encode(["push the puck"] * len(texts)))
    want = lerobot_first_action(folder, images, states, texts)
    assert torch.allclose(mean, want, atol=1e-6, rtol=0), (mean - want).abs().max()
    assert not torch.allclose(mean, other, atol=1e-6)
    n, a = 2, 4
    _, lp, actions = policy.act(images[:n], states[:n], ids[:n], generator=torch.Generator().manual_seed(0))
    batch = SimpleNamespace(
        extras={"images": images[:n, None], "states": states[:n, None], "actions": actions[:, None],
                "instr": ids[:n]},
        mask=torch.ones(n, a),
    )  # fmt: skip
    got = policy.log_probs(batch)
    want_lp = gaussian_log_prob(actions, mean[:n], policy.clamped_log_std().expand_as(actions))
    assert torch.allclose(got.detach(), want_lp, atol=1e-5) and torch.allclose(lp, want_lp, atol=1e-5)
    got.sum().backward()
    assert policy.log_std.grad.abs().sum() > 0
    assert policy.lerobot_policy.model.action_out_proj.weight.grad.abs().sum() > 0


def test_policy_folders_wmrl_cannot_post_train_fail_with_one_line(user_act, tmp_path, capsys):
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.pi0.configuration_pi0 import PI0Config

    folder = user_act[0]
    DiffusionConfig().save_pretrained(tmp_path / "diffusion")
    PI0Config().save_pretrained(tmp_path / "pi0")
    (tmp_path / "empty").mkdir()
    base = ["run", "vla-debug", "--out-dir", str(tmp_path / "run"), "--domain.env.type=metaworld",
            f"--domain.env.task={TASK}", f"--domain.image_size={SIZE}"]  # fmt: skip
    cases = {
        tmp_path / "diffusion": "is a diffusion policy conditioned on n_obs_steps=2 observations; WMRL "
        "feeds one per step (train it with --policy.n_obs_steps=1)",
        tmp_path / "pi0": "holds a 'pi0' policy, which has no log-probability for GRPO yet (pi0's PaliGemma "
        "backbone is not available offline and its flow-matching chain is not wired in); supported: act, "
        "smolvla, diffusion",
        tmp_path / "empty": "has no config.json; point it at the `pretrained_model` folder",
    }
    for path, message in cases.items():
        assert cli_main([*base, f"--domain.policy_path={path}"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert cli_main([*base[:-1], "--domain.image_size=64", f"--domain.policy_path={folder}"]) == 2
    assert "trained on images of shape [3, 32, 32]; set domain.image_size=32" in capsys.readouterr().err
    assert cli_main([*base[:5], "--domain.env.type=metaworld", "--domain.env.task=reach-v9"]) == 2
    assert (
        "domain.env.task='reach-v9' is not a lerobot MetaWorld task; close: reach-v3"
        in capsys.readouterr().err
    )
    assert cli_main([*base[:4], "--domain.env.type=libero", "--domain.env.task=libero_10"]) == 2
    assert "domain.env.type='libero': WMRL runs lerobot's metaworld env so far" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_exported_folder_lerobot_evaluates_with_wmrls_success(user_act, tmp_path):
    """Round trip: post-trained weights -> lerobot folder -> lerobot's eval_policy, episode by
    episode equal to WMRL's own greedy rollouts in the same env from the same seeds."""
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, evaluate_with_lerobot, register_task
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    folder = user_act[0]
    policy = PretrainedLeRobotPolicy(folder)
    with torch.no_grad():  # stand-in for post-training: every weight moves
        g = torch.Generator().manual_seed(1)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    policy.save_pretrained(tmp_path / "out")
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=TASK, episode_length=STEPS))
    pool = EnvPool(SIZE)
    seeds = [3, 4, 5]
    ours = run_episodes(policy_actor(policy, 0.0), [(task_id, s) for s in seeds], pool, "test")
    pool.close()
    theirs = evaluate_with_lerobot(str(tmp_path / "out"), TASK, SIZE, STEPS, len(seeds), start_seed=seeds[0])
    per_episode = theirs["per_episode"]
    assert [bool(e["success"]) for e in per_episode] == [bool(r.success.max()) for r in ours]
    for e, r in zip(per_episode, ours, strict=True):  # failed episodes: the same best shaped reward
        if not r.success.max():
            assert e["max_reward"] / 10 == pytest.approx(float(r.progress.max()), abs=1e-5)
    # and the exported folder's deterministic actions are WMRL's, through lerobot's loaders
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    lr = get_policy_class("act").from_pretrained(str(tmp_path / "out")).eval()
    pre, post = make_pre_post_processors(lr.config, pretrained_path=str(tmp_path / "out"))
    images, states = user_act[2], user_act[3]
    with torch.no_grad():
        got = post(
            lr.select_action(pre({"observation.image": images.float() / 255, "observation.state": states}))
        )
        want = policy.step_mean(images, states)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


def test_lerobot_eval_with_n_action_steps_1_runs_a_chunked_act_as_wmrl_does(user_act):
    """The user's ACT (chunk_size 5, n_action_steps 5) evaluated by lerobot with n_action_steps=1
    steps, episode by episode, WMRL's greedy rollouts of the same folder (same shaped reward at every
    step, so the same sum); as saved it executes 5 actions per chunk open-loop and the rewards differ.
    Out-of-range values are refused in one line."""
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, evaluate_with_lerobot, register_task
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    folder, steps, seeds = str(user_act[0]), 30, [3, 4]
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=TASK, episode_length=steps))
    pool = EnvPool(SIZE)
    ours = run_episodes(
        policy_actor(PretrainedLeRobotPolicy(folder), 0.0), [(task_id, s) for s in seeds], pool, "test"
    )
    pool.close()
    closed, saved = (
        evaluate_with_lerobot(folder, TASK, SIZE, steps, 0, 0, seeds=seeds, n_action_steps=n)["per_episode"]
        for n in (1, None)
    )
    assert not any(r.success.max() for r in ours)  # 4 training steps: every reward is the shaped one
    wmrl_sums = [10 * float(r.progress.sum()) for r in ours]
    assert [e["sum_reward"] for e in closed] == pytest.approx(wmrl_sums, abs=1e-3)
    assert [e["sum_reward"] for e in saved] != pytest.approx(wmrl_sums, abs=1e-3)
    for n in (0, 6):
        with pytest.raises(ValueError, match=rf"n_action_steps={n} is outside \[1, chunk_size=5\]"):
            evaluate_with_lerobot(folder, TASK, SIZE, steps, 0, 0, seeds=seeds, n_action_steps=n)


def test_at_lerobots_own_size_wmrl_steps_the_env_lerobot_eval_makes():
    """`--domain.image_size=480 --domain.env.episode_length=500` (lerobot's own MetaWorld values): the
    env WMRL rolls out in is, frame for frame, the one `lerobot-eval --env.type=metaworld` builds
    (lerobot.envs.make_env), shadows and all, so its command line evaluates a post-trained policy
    in the same env."""
    from lerobot.envs.configs import MetaworldEnv as MetaworldEnvConfig
    from lerobot.envs.factory import make_env

    from wmrl_vla.lerobot_env import LeRobotMetaWorldTask, lerobot_image_size

    size = lerobot_image_size()
    (venv,) = make_env(MetaworldEnvConfig(task=TASK), n_envs=1)[TASK].values()
    ours = LeRobotMetaWorldTask(TASK, image_size=size, episode_length=500)
    try:
        assert size == 480 and venv.call("_max_episode_steps")[0] == ours.max_steps == 500
        theirs_obs, _ = venv.reset(seed=[7])
        our_obs, _ = ours.reset(seed=7)
        actions = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
        for a in [None, *actions]:
            if a is not None:
                theirs_obs, reward, *_ = venv.step(a[None])
                our_obs, progress, *_ = ours.step(a)
                assert progress == pytest.approx(min(float(reward[0]) / 10, 1.0), abs=1e-6)
            np.testing.assert_array_equal(our_obs["image"], theirs_obs["pixels"][0])
            np.testing.assert_allclose(our_obs["state"], theirs_obs["agent_pos"][0], rtol=0, atol=1e-6)
    finally:
        venv.close()
        ours.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,method", [("act", "real"), ("act", "ppi"), ("smolvla", "real"), ("smolvla", "ppi")]
)
def test_wmrl_run_post_trains_the_users_policy_and_exports_it_for_lerobot(
    request, user_data, tmp_path, kind, method
):
    """`wmrl run` on the user's folder (ACT, SmolVLA), env and dataset, then `wmrl export`: the run
    moved the network's weights and the Gaussian's log_std, its world model pretrained on the user's
    dataset, and the exported folder acts, through lerobot's loaders, as the run's final policy."""
    from wmrl.config import load_config
    from wmrl.export import export_run
    from wmrl.trainer import Trainer
    from wmrl_vla.data import load_episodes
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

    folder, root, images, states = request.getfixturevalue(f"user_{kind}")
    texts = user_data[3]
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={tmp_path / 'run'}", f"--method={method}", "--domain.env.type=metaworld",
         f"--domain.env.task={TASK}", f"--domain.env.episode_length={RUN_STEPS}", "--domain.max_steps=null",
         f"--domain.image_size={SIZE}", f"--domain.policy_path={folder}", f"--domain.dataset_root={root / 'data'}",
         f"--domain.cache_dir={root / f'cache_{kind}'}", "--domain.wm_policy_rollouts_per_task=1",
         "--domain.eval_episodes_per_task=1", "--domain.record_anchors=false", "--grpo.steps=1",
         "--grpo.tasks_per_step=2", "--grpo.group_size=2", "--grpo.lr=0.01",
         *(["--domain.twin_anchors=true"] if method == "ppi" else [])],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        user = load_episodes(root / "data", "user/reach")
        wm = domain.world_model
        np.testing.assert_array_equal(wm.episodes[0]["actions"], user[0]["action"])
        before = len(wm.episodes)
        last = Trainer(cfg, domain).train()
        assert last["exec/real_total"] > 0
        # the anchors ran in lerobot's env, and the WM (ppi) trained on them after the user's demos
        anchors = wm.episodes[before:]
        assert len(anchors) == (last["exec/real_total"] if method == "ppi" else 0)
        assert all(e["instruction"] == texts[0] and len(e["actions"]) <= RUN_STEPS for e in anchors)
        np.testing.assert_array_equal(wm.episodes[0]["actions"], user[0]["action"])
        source = PretrainedLeRobotPolicy(folder)
        final = domain.policy.eval()
        assert not torch.equal(final.log_std, source.log_std)
        moved = [not torch.equal(a, b) for a, b in zip(source.parameters(), final.parameters(), strict=True)]
        assert sum(moved) > len(moved) // 2
        export_run(tmp_path / "run", tmp_path / "out")
        manifest = json.loads((tmp_path / "out" / "wmrl_export.json").read_text())
        # 32 px: lerobot-eval's MetaWorld env renders 480 px, so the folder names lerobot's eval_policy
        assert "lerobot-eval renders MetaWorld at its own size, not the 32 px" in manifest["policy"]["load"]
        assert "python -m wmrl_vla.lerobot_eval --policy DIR" in manifest["policy"]["load"]
        # what that command reads: the run's env, size, length and number of evaluation episodes
        assert manifest["evaluation"] == {
            "env_type": "metaworld", "task": TASK, "image_size": SIZE, "episode_length": RUN_STEPS,
            "episodes": 1, "seeds": "1000000 + 7919 k (WMRL's evaluation)",
        }  # fmt: skip
        assert any("noise 0" in n for n in manifest["notes"]) == (kind == "smolvla")
        got = lerobot_first_action(tmp_path / "out", images, states, texts)
        with torch.no_grad():
            want = final.step_mean(images, states, final.tokenizer.encode(texts))
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
    finally:
        domain.close()


def test_retraining_into_the_same_folder_changes_the_cache_keys(tmp_path):
    """The SFT-free policy, its rollouts and the WM are cached by the policy folder's and the
    dataset's contents (size, mtime), not their paths alone."""
    import os

    from wmrl_vla.demos import cache_key
    from wmrl_vla.pipeline import _policy_fields

    for name in ("policy", "data"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"0" * 8)
    cfg = SimpleNamespace(tasks=["lerobot/metaworld-reach-v3"], image_size=32, max_steps=None, policy="lerobot_act",
                          policy_path=str(tmp_path / "policy"), dataset_root=str(tmp_path / "data"))  # fmt: skip
    keys = [cache_key(_policy_fields(cfg))]
    for name in ("policy", "data"):
        f = tmp_path / name / "model.safetensors"
        f.write_bytes(b"1" * 8)
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
        keys.append(cache_key(_policy_fields(cfg)))
    assert len(set(keys)) == 3
