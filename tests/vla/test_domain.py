"""The VLA domain built from the vla-debug preset (real demos in a LeRobot dataset, real MuJoCo)."""

import json

import numpy as np
import pytest
import torch

from wmrl.config import load_config
from wmrl.tracking import policy_fingerprint
from wmrl_vla.config import VLAEvaluation, VLAWMRefinement
from wmrl_vla.rollout import replay_reward
from world_models.vla_dynamics import VLADynamics, instruction_ids, rollout_score


@pytest.fixture(scope="module")
def built(vla_debug):
    return vla_debug


@pytest.fixture(scope="module")
def batch(built):
    _, domain, _ = built
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(0))
    return domain.generate(tasks, 4, torch.tensor([True, False]))


def test_cached_stages_are_reused(built):
    cfg, domain, root = built
    cache = root / "cache"
    assert len(list(cache.glob("sft-*.pt"))) == 1 and len(list(cache.glob("wm-*.pt"))) == 1
    # the run names the build of the world model it started from (builds differ between machines)
    (wm_path,) = cache.glob("wm-*.pt")
    quality = json.loads((root / "run" / "wm_quality.json").read_text())
    assert quality["wm_sha1"] == policy_fingerprint(VLADynamics.load(wm_path))
    again = cfg.domain.build(cfg)
    for (k, a), b in zip(domain.policy.state_dict().items(), again.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    again.close()


def test_demos_keep_out_of_the_held_out_combinations(built):
    import sims
    from sims.own.base import combo_split
    from wmrl_vla.data import load_episodes
    from wmrl_vla.pipeline import DEMO_REPO

    cfg, _, root = built
    (demo_root,) = (root / "cache").glob("demos-*")
    demos = load_episodes(demo_root, DEMO_REPO)
    assert len(demos) == cfg.domain.demos_per_task * len(cfg.domain.tasks)
    splits = {}
    for split in ("all", "train"):
        env = sims.make(demos[0]["task_id"], render=False, split=split)
        for d in demos:
            env.reset(seed=d["seed"])
            u = env.unwrapped
            splits[split, d["seed"]] = (u.instruction_of(u.params), combo_split(*u.combo_of(u.params)))
        env.close()
    # some demo seed draws a held-out combination when the split is not enforced (seed 1 does) ...
    assert any(splits["all", d["seed"]][1] == "test" for d in demos)
    # ... yet every demo is that seed's split-"train" episode
    for d in demos:
        assert splits["train", d["seed"]] == (d["instruction"], "train")


def test_generate_mixes_sim_and_imagined_groups(built, batch):
    _, domain, _ = built
    kinds = [p["kind"] for p in batch.payload]
    assert kinds == ["sim"] * 4 + ["imagined"] * 4
    assert batch.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    n, t = batch.extras["step_mask"].shape
    assert batch.tokens.shape == (n, t * 4) and batch.extras["images"].shape == (n, t, 3, 32, 32)
    # the tokens' mask follows each rollout's length
    lengths = [len(p["actions"]) for p in batch.payload]
    assert batch.mask.reshape(n, t, 4)[:, :, 0].sum(1).tolist() == lengths
    # every rollout starts from its task's initial observation: same within a group
    assert torch.equal(batch.extras["init_images"][0], batch.extras["init_images"][3])
    assert torch.equal(batch.extras["init_images"][4], batch.extras["init_images"][7])
    # sim rollouts record their real reward; imagined ones do not have one
    assert all(0 <= p["reward"] <= 1 for p in batch.payload[:4])
    assert all(np.isnan(p["reward"]) for p in batch.payload[4:])


def test_log_probs_recompute_the_sampling_log_probs(built, batch):
    _, domain, _ = built
    lp = domain.policy.log_probs(batch)
    m = batch.mask.bool()
    assert torch.allclose(lp[m], batch.logprobs[m], atol=1e-5)


def test_imagining_on_the_first_frame_decodes_none_and_the_update_reads_what_the_policy_saw(
    built, monkeypatch
):
    """--domain.imagine_input=first_frame: the policy acts on its task's real first frame at every
    imagined step, with the WM's predicted proprioception; no frame is decoded."""
    _, domain, _ = built
    monkeypatch.setattr(domain, "imagine_input", "first_frame")

    def no_decoding(*args, **kwargs):
        raise AssertionError("a frame was decoded")

    monkeypatch.setattr(domain.world_model.model, "sample_frame", no_decoding)
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(3))
    batch = domain.generate(tasks, 4, torch.tensor([False, False]))
    images, states = batch.extras["images"], batch.extras["states"]
    first = batch.extras["init_images"]
    for i, p in enumerate(batch.payload):
        n = len(p["actions"])
        assert p["kind"] == "imagined" and torch.equal(images[i, :n], first[i].expand(n, *first[i].shape))
    moved = [
        len(p["actions"]) > 1 and not torch.equal(states[i, 0], states[i, 1])
        for i, p in enumerate(batch.payload)
    ]
    assert any(moved)  # the state the policy reads is the WM's prediction, not the first one
    lp = domain.policy.log_probs(batch)
    m = batch.mask.bool()
    assert torch.allclose(lp[m], batch.logprobs[m], atol=1e-5)


def test_execution_jobs_grade_the_real_rollouts(built, batch):
    cfg, domain, _ = built
    # the closed loop: the sim rollouts' rewards come back with the batch (no execution job)
    recorded = [p["reward"] for p in batch.payload[:4]]
    assert batch.real_rewards[:4].tolist() == pytest.approx(recorded) and batch.real_rewards[4:].isnan().all()
    # a job is a second real execution: the recorded actions re-simulated from the seed, the same reward
    jobs = domain.execution_jobs(batch, [0, 1, 2, 3])
    assert [j.fn(*j.args) for j in jobs] == pytest.approx(recorded, abs=1e-6)
    p = batch.payload[0]
    assert jobs[0].fn is replay_reward and jobs[0].args[:2] == (p["task_id"], p["seed"])
    assert jobs[0].args[4] == cfg.domain.max_steps
    with pytest.raises(ValueError, match="imagined"):
        domain.execution_jobs(batch, [5])


def test_predict_scores_each_action_sequence_with_every_member(built, batch):
    _, domain, _ = built
    pred = domain.world_model.predict(batch)
    assert pred.mean.shape == pred.var.shape == (8,)
    assert (pred.var >= 0).all()
    # row 2 scored directly: imagine its own actions from its own first frame
    ex = batch.extras
    prog, succ = domain.world_model.model.score_actions(
        ex["init_images"][2:3], ex["init_states"][2:3], ex["actions"][2:3], ex["step_mask"][2:3],
        instruction_ids([batch.payload[2]["instruction"]]),
    )  # fmt: skip
    scores = rollout_score(prog, succ)[:, 0]
    assert torch.allclose(pred.mean[2], scores.mean(), atol=1e-5)
    wm = domain.world_model
    raw = wm.raw_predict(batch)
    assert torch.allclose(raw.var[2], scores.var(unbiased=False), atol=1e-6)
    # the reported variance is the calibrated one: a * var + b
    assert torch.allclose(pred.var, wm.var_scale * raw.var + wm.var_floor)


def test_update_refines_the_world_model_and_records_anchors(built, batch):
    _, domain, root = built
    wm = domain.world_model
    before = [p.clone() for p in wm.model.parameters()]
    n_eps = len(wm.episodes)
    calib = (wm.var_scale, wm.var_floor)
    rewards = torch.tensor([p["reward"] for p in batch.payload[:4]])
    held = wm.raw_predict(batch.select(torch.arange(4)))  # scored before the WM trains on them
    metrics = wm.update(batch, torch.arange(4), rewards)
    assert metrics["episodes"] == n_eps + 4
    # the anchors' z^2 under the calibration before them, then a refit on the held-out pairs
    z2_raw = float((((held.mean - rewards) ** 2) / held.var.clamp(min=1e-8)).mean())
    assert metrics["z2_raw"] == pytest.approx(z2_raw, rel=1e-4)
    z2 = float((((held.mean - rewards) ** 2) / (calib[0] * held.var + calib[1]).clamp(min=1e-8)).mean())
    assert metrics["z2"] == pytest.approx(z2, rel=1e-4)
    assert len(wm.calib_pairs) == 4 and (wm.var_scale, wm.var_floor) != calib
    assert (metrics["var_scale"], metrics["var_floor"]) == (wm.var_scale, wm.var_floor)
    assert any(not torch.equal(a, b) for a, b in zip(before, wm.model.parameters(), strict=True))
    from wmrl_vla.data import load_episodes

    # the anchors are written in a process of their own; a checkpoint's state waits for them
    state = domain.state_dict()
    eps = load_episodes(root / "run" / "anchors", "wmrl/anchors")
    assert len(eps) == 4
    assert np.allclose(eps[0]["action"], batch.payload[0]["actions"])
    # state round trip
    domain.load_state_dict(state)
    assert domain.world_model.n_updates == 1
    assert (domain.world_model.var_scale, len(domain.world_model.calib_pairs)) == (wm.var_scale, 4)


def test_a_resumed_world_model_refines_on_the_replay_it_was_saved_with(built, batch, tmp_path):
    """A checkpoint keeps the anchor episodes of the WM's replay: a WM rebuilt from the demos and
    loaded from it (through a weights-only file) refines exactly as the one that saved it, the
    oldest demos trimmed alike; loaded from a checkpoint without them (as written before the replay
    was kept) it refines on another replay and ends elsewhere."""
    import copy

    from wmrl.tracking import safe_load
    from wmrl_vla.world_model import VLAWorldModel

    _, domain, _ = built
    base = domain.world_model
    n0 = len(base.initial_episodes)

    def fresh():
        return VLAWorldModel(
            copy.deepcopy(base.model), base.initial_episodes,
            refinement=VLAWMRefinement(update_steps=2, batch_size=4, horizon=base.refinement.horizon,
                                       state_horizon=base.refinement.state_horizon),
            max_episodes=n0, seed=3,
        )  # fmt: skip

    rewards = torch.tensor([p["reward"] for p in batch.payload[:4]])
    saved = fresh()
    torch.manual_seed(0)
    saved.update(batch, torch.arange(2), rewards[:2])
    assert len(saved.episodes) == n0 and saved.n_anchor_episodes == 2  # two demos made room
    torch.save(saved.state_dict(), tmp_path / "wm.pt")
    state = safe_load(tmp_path / "wm.pt")
    resumed, before = fresh(), fresh()
    resumed.load_state_dict(state)
    before.load_state_dict({k: v for k, v in state.items() if k != "anchor_episodes"})
    assert len(resumed.episodes) == n0 and resumed.episodes[0] is base.initial_episodes[2]
    for a, b in zip(resumed.episodes[-2:], saved.episodes[-2:], strict=True):
        assert a.keys() == b.keys() and a["instruction"] == b["instruction"]
        for k in ("images", "states", "actions", "progress", "success"):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    assert len(before.episodes) == n0 and before.n_anchor_episodes == 0
    for wm in (saved, resumed, before):
        torch.manual_seed(1)
        wm.update(batch, torch.arange(2, 4), rewards[2:4])
    pairs = list(
        zip(saved.model.parameters(), resumed.model.parameters(), before.model.parameters(), strict=True)
    )
    assert all(torch.equal(a, b) for a, b, _ in pairs)
    assert any(not torch.equal(a, c) for a, _, c in pairs)


def test_a_failed_anchor_write_is_raised_with_the_dataset_named(tmp_path, batch):
    from wmrl_vla.world_model import AnchorRecorder

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the dataset's folder should be")
    recorder = AnchorRecorder(str(blocker / "anchors"), "wmrl/anchors")
    recorder.submit([batch.payload[0]["rollout"]])
    with pytest.raises(RuntimeError, match="not-a-folder"):
        recorder.close()


def test_waiting_for_an_anchor_write_is_shown_and_counted_apart(capfd):
    """The first anchor write starts the recording process and imports lerobot (tens of seconds):
    a flush that waits shows it as a stage line, not a frozen training bar, and counts the wait
    (the WM update reports it as anchor_write_wait_s)."""
    import threading
    import time
    from concurrent.futures import Future

    from wmrl_vla.world_model import AnchorRecorder

    recorder = AnchorRecorder("runs/x/anchors", "wmrl/anchors")
    pending: Future = Future()
    recorder._pending = pending
    threading.Timer(0.3, lambda: pending.set_result(None)).start()
    start = time.perf_counter()
    recorder.flush()
    # counted, not timed: the flush waited for a write that lands 0.3 s after the timer started (a
    # loaded machine starts the flush some ms later), so the count is well above 0 and within the call
    assert 0.15 < recorder.wait_s <= time.perf_counter() - start
    assert (
        "[vla] writing anchor rollouts to the LeRobot dataset runs/x/anchors [00:00]"
        in capfd.readouterr().err
    )
    quiet = AnchorRecorder("runs/x/anchors", "wmrl/anchors", progress=False)  # tracking.progress=false
    later: Future = Future()
    quiet._pending = later
    threading.Timer(0.1, lambda: later.set_result(None)).start()
    quiet.flush()
    assert capfd.readouterr().err == ""


def test_evaluate_in_the_simulator_saves_videos(built):
    _, domain, root = built
    out = domain.evaluate("eval")
    assert 0 <= out["success"] <= 1 and 0 <= out["reward"] <= 1
    assert "success/ReachColor-v0" in out
    gifs = sorted(p.name for p in (root / "run" / "videos").glob("*.gif"))
    assert any(g.endswith("_real_vs_imagined.gif") for g in gifs)
    assert any(g.endswith(("_success.gif", "_fail.gif")) for g in gifs)


def test_eval_combos_picks_the_combinations_of_the_held_out_seeds(built, monkeypatch):
    """Held-out seeds either way; instruction/colour combinations held out (default) or trained on."""
    import wmrl_vla.domain as vla_domain
    import wmrl_vla.rollout as vla_rollout

    _, domain, _ = built
    seen = []

    def record(actor, specs, pool, env_split, noise=None):
        seen.append((env_split, [seed for _, seed in specs]))
        return real(actor, specs, pool, env_split, noise=noise)

    real = vla_rollout.run_episodes
    monkeypatch.setattr(vla_rollout, "run_episodes", record)
    monkeypatch.setattr(domain.evaluation, "n_videos", 0)
    monkeypatch.setattr(domain.evaluation, "episodes_per_task", 1)
    for combos in ("test", "train"):
        monkeypatch.setattr(domain.evaluation, "combos", combos)
        domain.evaluate("eval")
    (test_split, test_seeds), (train_split, train_seeds) = seen
    assert (test_split, train_split) == ("test", "train") and test_seeds == train_seeds
    assert min(test_seeds) >= vla_domain.EVAL_SEEDS[0]
    with pytest.raises(ValueError, match="eval_combos"):
        vla_domain.VLADomain(
            domain.policy, domain.world_model, domain.tasks, 32, evaluation=VLAEvaluation(combos="all")
        )
    from wmrl.config import ConfigError

    with pytest.raises(ConfigError, match="eval_combos='all' is not one of test, train"):
        load_config("vla-debug", ["--domain.eval_combos=all"])
    with pytest.raises(ConfigError, match="eval_lockstep=0 must be >= 1"):
        load_config("vla-debug", ["--domain.eval_lockstep=0"])


def test_evaluation_runs_in_lockstep_chunks_with_the_same_result(built, monkeypatch):
    """eval_lockstep bounds the episodes (envs + renderers) alive at once; greedy figures unchanged."""
    import wmrl_vla.rollout as vla_rollout

    _, domain, _ = built
    sizes = []
    real = vla_rollout.run_episodes

    def record(actor, specs, pool, env_split, noise=None):
        sizes.append(len(specs))
        return real(actor, specs, pool, env_split, noise=noise)

    monkeypatch.setattr(vla_rollout, "run_episodes", record)
    for k, v in {"n_videos": 0, "episodes_per_task": 3, "temperature": 0.0}.items():
        monkeypatch.setattr(domain.evaluation, k, v)
    n = 3 * len(domain.tasks)
    monkeypatch.setattr(domain.evaluation, "lockstep", 64)
    whole = domain.evaluate("eval")
    monkeypatch.setattr(domain.evaluation, "lockstep", 2)
    chunked = domain.evaluate("eval")
    assert sizes == [n] + [2] * (n // 2) + [1] * (n % 2)
    assert chunked == whole


def test_eval_sampled_adds_the_sampled_policys_success_on_the_same_episodes(built, monkeypatch):
    """Greedy figures unchanged by the second pass; the sampled ones equal a plain evaluation at the
    training temperature."""
    from wmrl.config import ConfigError

    _, domain, _ = built
    for k, v in {"n_videos": 0, "episodes_per_task": 2, "temperature": 0.0}.items():
        monkeypatch.setattr(domain.evaluation, k, v)
    greedy = domain.evaluate("eval")
    monkeypatch.setattr(domain.evaluation, "sampled", True)
    both = domain.evaluate("eval")
    monkeypatch.setattr(domain.evaluation, "sampled", False)
    monkeypatch.setattr(domain.evaluation, "temperature", domain.temperature)
    sampled = domain.evaluate("eval")
    assert {k: v for k, v in both.items() if "_sampled" not in k} == greedy
    names = [f"success/{t.split('/')[-1]}" for t in domain.tasks]
    for key in ["success", "reward", "episode_length", *names]:
        first, _, rest = key.partition("/")
        assert both[f"{first}_sampled" + (f"/{rest}" if rest else "")] == sampled[key], key
    assert any(both[f"{k}_sampled"] != greedy[k] for k in ("reward", "episode_length"))  # another policy
    with pytest.raises(ConfigError, match="eval_sampled=true with domain.eval_temperature equal"):
        load_config("vla-debug", ["--domain.eval_sampled=true", "--domain.eval_temperature=1.0"])


def test_real_vs_imagined_frames_start_from_the_real_first_frame_and_change_no_generator(built, batch):
    _, domain, _ = built
    r = next(p["rollout"] for p in batch.payload if p["kind"] == "sim")
    states = torch.get_rng_state(), domain.gen.get_state()
    frames = domain.real_vs_imagined(r)
    h, w = r.images.shape[-2:]
    assert frames.dtype == np.uint8 and frames.shape[1:] == (3, h, 3 * w) and len(frames) >= len(r.images)
    real, replay, dream = frames[..., :w], frames[..., w : 2 * w], frames[..., 2 * w :]
    assert np.array_equal(real[: len(r.images)], r.images)  # then its last frame held
    assert np.array_equal(replay[0], r.images[0]) and np.array_equal(dream[0], r.images[0])
    assert not np.array_equal(replay[1:], dream[1:])  # the WM's own replay and the policy's dream differ
    assert np.array_equal(frames, domain.real_vs_imagined(r))
    assert torch.equal(torch.get_rng_state(), states[0]) and torch.equal(domain.gen.get_state(), states[1])


def test_bad_inputs(built):
    _, domain, _ = built
    with pytest.raises(ValueError, match="split"):
        domain.sample_tasks(1, "validation", torch.Generator())
    from wmrl.config import ConfigError
    from wmrl_vla.config import VLAConfig

    with pytest.raises(ConfigError, match="world_model"):
        VLAConfig(world_model="gan")
    with pytest.raises(ConfigError):
        load_config("vla-debug", ["--domain.world_model=gan"])
    with pytest.raises(ConfigError, match="wm_integrator=true needs domain.wm_outcome=state"):
        VLAConfig(wm_integrator=True, wm_outcome="latent")
    with pytest.raises(ConfigError, match="wm_outcome_reads='sceen' is not one of scene, geometry"):
        VLAConfig(wm_outcome="state", wm_outcome_reads="sceen")
    with pytest.raises(ConfigError, match="wm_outcome_reads=geometry needs domain.wm_outcome=state"):
        VLAConfig(wm_outcome="state", wm_outcome_reads="geometry", wm_instruction_buckets=0)


def test_lerobot_act_policy_through_the_domain(built, tmp_path):
    """policy=lerobot_act: same domain, continuous Gaussian actions, log-probs recomputed exactly."""
    cfg, _, root = built
    over = [f"--out_dir={tmp_path}", f"--domain.cache_dir={root / 'cache'}", "--domain.policy=lerobot_act"]
    act_cfg = load_config("vla-debug", over)
    domain = act_cfg.domain.build(act_cfg)
    from wmrl_vla.lerobot_bridge import ACTGaussianPolicy

    assert isinstance(domain.policy, ACTGaussianPolicy)
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(1))
    batch = domain.generate(tasks, 2, torch.tensor([True, False]))
    lp = domain.policy.log_probs(batch)
    m = batch.mask.bool()
    assert torch.allclose(lp[m], batch.logprobs[m], atol=1e-4)
    assert batch.payload[0]["kind"] == "sim" and batch.payload[2]["kind"] == "imagined"
    domain.close()


def test_sharded_generation_joins_into_a_batch_the_policy_scores(built):
    """Data-parallel ``generation=shard``: each rank (reseeded by ``shard_rng``) rolls out its share
    (sim and imagined groups), padded to its longest rollout; the joined batch pads every extra to
    the longest share and the policy re-scores each rollout's steps as its rank sampled them."""
    from wmrl.distributed import join_shares

    _, domain, _ = built
    tasks = domain.sample_tasks(3, "train", torch.Generator().manual_seed(1))
    anchors = torch.tensor([True, False, True])
    parts = []
    for rank, sl in ((0, slice(0, 2)), (1, slice(2, 3))):
        domain.shard_rng(rank, step=3)
        parts.append((domain.generate(tasks[sl], 2, anchors[sl]), len(tasks[sl])))
    batch, _, src_rank, src_row = join_shares(parts, getattr(domain, "extras_padding", None))
    t_max = max(b.extras["step_mask"].shape[1] for b, _ in parts)
    assert batch.extras["images"].shape[1] == batch.extras["step_mask"].shape[1] == t_max
    lp = domain.policy.log_probs(batch)
    m = batch.mask.bool()
    assert torch.allclose(lp[m], batch.logprobs[m], atol=1e-5)
    for r, (part, _) in enumerate(parts):
        rows = (src_rank == r).nonzero().squeeze(-1)
        steps = part.extras["step_mask"].sum(1)
        assert torch.equal(batch.extras["step_mask"][rows].sum(1), steps[src_row[rows]])


def test_rollout_media_shows_the_simulator_beside_the_world_model(built, batch):
    """wandb media of a step: the first real rollout's frames (left) beside the WM's imagined frames
    under the same actions (right), upscaled; the first imagined rollout; a table of every rollout."""
    from wmrl.tracking import Table, Video

    _, domain, _ = built
    pred = domain.world_model.predict(batch).mean
    true = torch.tensor([p["reward"] for p in batch.payload], dtype=torch.float32)
    media = domain.rollout_media(batch, pred, true, scale=2)
    video = media["rollouts/real_vs_imagined"]
    assert isinstance(video, Video)
    real = np.asarray(batch.payload[0]["images"])  # [T, 3, 32, 32]
    assert video.frames.shape == (len(real), 3, 64, 128) and video.frames.dtype == np.uint8
    assert np.array_equal(video.frames[:, :, ::2, :64:2], real)
    assert np.array_equal(video.frames[0, :, ::2, 64::2], real[0])  # both start from the same frame
    assert not np.array_equal(video.frames[1:, :, :, 64:], video.frames[1:, :, :, :64])  # imagined
    assert media["rollouts/imagined"].frames.shape[1:] == (3, 64, 64)
    table = media["rollouts/table"]
    assert isinstance(table, Table) and len(table.rows) == batch.n_rollouts
    assert [r[1] for r in table.rows] == [p["kind"] for p in batch.payload]
    assert table.rows[0][5] == pytest.approx(float(true[0])) and table.rows[-1][5] is None


def test_twin_groups_share_the_real_rollouts_sampling_noise(built):
    _, domain, _ = built
    domain.twin_anchors = True
    try:
        tasks = domain.sample_tasks(3, "train", torch.Generator().manual_seed(1))
        batch = domain.generate(tasks, 4, torch.tensor([True, False, True]))
    finally:
        domain.twin_anchors = False
    assert batch.n_groups == 5 and batch.real_row.tolist() == [-1] * 12 + [0, 1, 2, 3, 8, 9, 10, 11]
    assert batch.tasks[3:] == [tasks[0], tasks[2]]
    kinds = [p["kind"] for p in batch.payload]
    assert kinds == ["sim"] * 4 + ["imagined"] * 4 + ["sim"] * 4 + ["imagined"] * 8
    for twin, real in ((3, 0), (4, 2)):
        for j in range(4):
            t, r = batch.payload[4 * twin + j], batch.payload[4 * real + j]
            assert (t["task_id"], t["seed"]) == (r["task_id"], r["seed"])
            # same first observation and the same uniforms: the same first action
            np.testing.assert_array_equal(t["bins"][0], r["bins"][0])
    # the uniforms are per rollout: a group's rollouts do not all start alike
    assert len({batch.payload[j]["bins"][0].tobytes() for j in range(4)}) > 1
    m = batch.mask.bool()  # the recorded log-probs are the policy's, twins included
    assert torch.allclose(domain.policy.log_probs(batch)[m], batch.logprobs[m], atol=1e-5)


def test_ppi_step_uses_the_twin_groups(built, tmp_path):
    from wmrl.trainer import Trainer

    cfg, _, root = built
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={tmp_path / 'run'}", f"--domain.cache_dir={root / 'cache'}", "--method=ppi",
         "--domain.twin_anchors=true", "--grpo.tasks_per_step=4", "--anchors.fraction=0.5",
         "--domain.record_anchors=false"],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        metrics = Trainer(cfg, domain).train_step()
    finally:
        domain.close()
    assert metrics["exec/real_total"] == 2 * cfg.grpo.group_size  # twins are never executed
    assert "ppi/rho" in metrics and "wm/z2_raw" in metrics


def test_a_grounded_world_model_gets_each_tasks_goal_from_its_reset(built):
    """``--domain.wm_outcome=state``: every rollout's ``wm_goal`` is its task's named object xy as the
    simulator placed it (read here from a fresh env), imagined rollouts start from the real state,
    and the anchors the WM refines on keep their goal."""
    import sims

    cfg, _, root = built
    cfg = load_config("vla-debug", [f"--out_dir={root / 'grounded'}", f"--domain.cache_dir={root / 'cache'}",
                                    "--domain.wm_outcome=state"])  # fmt: skip
    cached = set((root / "cache").glob("wm-*.pt"))
    domain = cfg.domain.build(cfg)
    try:
        assert domain.world_model.model.grounded is not None
        assert len(set((root / "cache").glob("wm-*.pt")) - cached) == 1  # its own cache entry
        tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(1))
        batch = domain.generate(tasks, 3, torch.tensor([True, False]))
        for i, p in enumerate(batch.payload):
            env = sims.make(p["task_id"], render=False, split="train")
            obs, _ = env.reset(seed=p["seed"])
            goal = np.asarray(next(iter(env.unwrapped.privileged().values())))[:2]
            env.close()
            assert np.allclose(batch.extras["wm_goal"][i].numpy(), goal, atol=1e-6), i
            assert np.allclose(batch.extras["states"][i, 0].numpy(), obs["state"], atol=1e-6), i
        pred = domain.world_model.predict(batch)
        assert pred.mean.shape == (6,) and torch.isfinite(pred.mean).all()
        wm = domain.world_model
        wm.update(batch, torch.arange(3), torch.tensor([p["reward"] for p in batch.payload[:3]]))
        assert np.allclose(wm.episodes[-1]["goal"], batch.extras["wm_goal"][2].numpy())
    finally:
        domain.close()


def test_update_logs_the_success_auc_of_held_out_scores_over_the_window(built, batch):
    """``wm/success_auc``: sklearn's ROC AUC of the anchors' scores, each taken before the WM trained
    on it, against their real success, over every anchor of the window so far."""
    import copy
    import dataclasses

    from sklearn.metrics import roc_auc_score

    _, domain, _ = built
    # a copy (the module's other tests see the domain's WM untouched) that records no anchors
    wm = copy.deepcopy(domain.world_model, memo={id(domain.world_model.recorder): None})
    wm.refinement.update_steps, wm.outcome_pairs = 1, []  # an empty window
    # successes and failures among the anchors, whatever this tiny policy achieved
    labelled = dataclasses.replace(
        batch, payload=[dict(p, success=float(k % 2)) for k, p in enumerate(batch.payload)]
    )
    rewards = torch.tensor([p["reward"] for p in batch.payload[:4]])
    first = wm.raw_predict(labelled.select(torch.arange(2))).mean
    assert wm.update(labelled, torch.arange(2), rewards[:2])["success_auc"] == roc_auc_score([0, 1], first)
    second = wm.raw_predict(labelled.select(torch.arange(2, 4))).mean  # after the first update
    metrics = wm.update(labelled, torch.arange(2, 4), rewards[2:])
    assert metrics["success_auc"] == pytest.approx(roc_auc_score([0, 1, 0, 1], torch.cat([first, second])))
    assert [p[1] for p in wm.outcome_pairs] == [0.0, 1.0, 0.0, 1.0]


def test_a_copied_start_is_loaded_not_rebuilt_same_policy_and_first_step(built, tmp_path):
    """One start per grid across machines: the domain's cache folder copied to a second folder (as
    to another machine) builds a domain whose policy has the same SHA-1 and whose first training
    step gives the same metrics, and the build writes nothing into the copy (loaded, not rebuilt)."""
    import shutil

    from wmrl.tracking import policy_fingerprint
    from wmrl.trainer import Trainer

    _, _, root = built
    copy = tmp_path / "other_machine_cache"
    shutil.copytree(root / "cache", copy)
    files = {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()}
    steps, shas = [], []
    for k, cache in enumerate((root / "cache", copy)):
        cfg = load_config(
            "vla-debug",
            [f"--out_dir={tmp_path / f'run{k}'}", f"--domain.cache_dir={cache}", "--grpo.tasks_per_step=2",
             "--domain.record_anchors=false", "--method=wmrl"],
        )  # fmt: skip
        torch.manual_seed(0)
        domain = cfg.domain.build(cfg)
        try:
            shas.append(policy_fingerprint(domain.policy))
            metrics = Trainer(cfg, domain).train_step()
            steps.append({k: "nan" if v != v else v for k, v in metrics.items() if not k.startswith("time/")})
        finally:
            domain.close()
    assert shas[0] == shas[1]
    assert steps[0] == steps[1]
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()} == files
