"""WMRL as a post-training step of the lerobot workflow (wmrl_vla.lerobot_policy, wmrl_vla.lerobot_env).

The fixture is what a lerobot user brings: a LeRobotDataset recorded in lerobot's MetaWorld env and a
tiny ACT trained on it by lerobot's own training loop, saved as its ``pretrained_model`` folder.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wmrl.cli import main as cli_main

TASK, SIZE, STEPS = "reach-v3", 32, 60
TINY_ACT = dict(
    dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1,
    n_vae_encoder_layers=1, latent_dim=8, chunk_size=5, n_action_steps=5,
)  # fmt: skip


@pytest.fixture(scope="module")
def user_act(tmp_path_factory):
    """(pretrained_model folder, dataset root, its frames): 3 expert episodes, ACT trained 4 steps."""
    from wmrl_vla.data import record_demos
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task
    from wmrl_vla.lerobot_policy import train_act

    root = tmp_path_factory.mktemp("lerobot_user")
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=TASK, episode_length=STEPS))
    ds = record_demos([task_id], 3, root / "data", "user/reach", image_size=SIZE, seed=100, max_steps=STEPS)
    folder = train_act(root / "data", "user/reach", root / "train", steps=4, **TINY_ACT)
    frames = [ds[i] for i in range(0, ds.num_frames, 20)]
    images = torch.stack([(f["observation.image"] * 255).round().to(torch.uint8) for f in frames])
    states = torch.stack([f["observation.state"] for f in frames])
    return folder, root, images, states


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


def test_policy_folders_wmrl_cannot_post_train_fail_with_one_line(user_act, tmp_path, capsys):
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

    folder = user_act[0]
    DiffusionConfig().save_pretrained(tmp_path / "diffusion")
    (tmp_path / "empty").mkdir()
    base = ["run", "vla-debug", "--out-dir", str(tmp_path / "run"), "--domain.env.type=metaworld",
            f"--domain.env.task={TASK}", f"--domain.image_size={SIZE}"]  # fmt: skip
    cases = {
        tmp_path / "diffusion": "holds a 'diffusion' policy; WMRL post-trains act",
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


@pytest.mark.slow
@pytest.mark.parametrize("method", ["real", "ppi"])
def test_wmrl_run_post_trains_the_users_act_and_exports_it_for_lerobot(user_act, tmp_path, method):
    """`wmrl run` on the user's folder, env and dataset, then `wmrl export`: the run moved ACT's
    weights and the Gaussian's log_std, its world model pretrained on the user's dataset, and the
    exported folder acts, through lerobot's loaders, as the run's final policy."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    from wmrl.config import load_config
    from wmrl.export import export_run
    from wmrl.trainer import Trainer
    from wmrl_vla.data import load_episodes
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

    folder, root, images, states = user_act
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={tmp_path / 'run'}", f"--method={method}", "--domain.env.type=metaworld",
         f"--domain.env.task={TASK}", f"--domain.env.episode_length={STEPS}", "--domain.max_steps=null",
         f"--domain.image_size={SIZE}", f"--domain.policy_path={folder}", f"--domain.dataset_root={root / 'data'}",
         f"--domain.cache_dir={tmp_path / 'cache'}", "--domain.wm_policy_rollouts_per_task=1",
         "--domain.eval_episodes_per_task=1", "--domain.record_anchors=false", "--grpo.steps=1",
         "--grpo.tasks_per_step=2", "--grpo.group_size=2", "--grpo.lr=0.01",
         *(["--domain.twin_anchors=true"] if method == "ppi" else [])],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        user = load_episodes(root / "data", "user/reach")
        np.testing.assert_array_equal(domain.world_model.episodes[0]["actions"], user[0]["action"])
        last = Trainer(cfg, domain).train()
        assert last["exec/real_total"] > 0
        source = PretrainedLeRobotPolicy(folder)
        final = domain.policy.eval()
        assert not torch.equal(final.log_std, source.log_std)
        moved = [not torch.equal(a, b) for a, b in zip(source.parameters(), final.parameters(), strict=True)]
        assert sum(moved) > len(moved) // 2
        export_run(tmp_path / "run", tmp_path / "out")
        lr = get_policy_class("act").from_pretrained(str(tmp_path / "out")).eval()
        pre, post = make_pre_post_processors(lr.config, pretrained_path=str(tmp_path / "out"))
        with torch.no_grad():
            got = post(
                lr.select_action(
                    pre({"observation.image": images.float() / 255, "observation.state": states})
                )
            )
            want = final.step_mean(images, states)
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
    finally:
        domain.close()


def test_retraining_into_the_same_folder_changes_the_cache_keys(tmp_path):
    """The SFT-free policy, its rollouts and the WM are cached by the policy folder's and the
    dataset's contents (size, mtime), not their paths alone."""
    import os

    from wmrl_vla.pipeline import _key, _policy_fields

    for name in ("policy", "data"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"0" * 8)
    cfg = SimpleNamespace(tasks=["lerobot/metaworld-reach-v3"], image_size=32, max_steps=None,
                          policy_path=str(tmp_path / "policy"), dataset_root=str(tmp_path / "data"))  # fmt: skip
    keys = [_key(_policy_fields(cfg))]
    for name in ("policy", "data"):
        f = tmp_path / name / "model.safetensors"
        f.write_bytes(b"1" * 8)
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
        keys.append(_key(_policy_fields(cfg)))
    assert len(set(keys)) == 3
