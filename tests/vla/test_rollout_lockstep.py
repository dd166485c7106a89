"""domain.rollout_lockstep: a step's simulated rollouts in chunks, and the env pool's bound.

Envs are real ones (``sims.make``), counted as they are built and closed."""

import numpy as np
import pytest
import torch

from wmrl_vla.config import VLAEvaluation
from wmrl_vla.domain import VLADomain
from wmrl_vla.rollout import EnvPool

TWO_TASKS = ["wmrl/ReachColor-v0", "wmrl/PressButton-v0"]


@pytest.fixture
def live_envs(monkeypatch):
    """Counts the real envs alive (built by ``sims.make``, not yet closed): ``counts["peak"]``."""
    import sims

    counts = {"live": 0, "peak": 0, "built": 0}
    make = sims.make

    def counted(*args, **kwargs):
        env = make(*args, **kwargs)
        close = env.close

        def closed():
            counts["live"] -= 1
            close()

        env.close = closed
        counts["live"] += 1
        counts["built"] += 1
        counts["peak"] = max(counts["peak"], counts["live"])
        return env

    monkeypatch.setattr(sims, "make", counted)
    return counts


def domain_of(built, tasks=None, **kwargs) -> VLADomain:
    """A domain on the built vla-debug policy and world model (close its pool, not the domain: the
    world model is shared with the other tests)."""
    cfg, domain, _ = built
    return VLADomain(domain.policy, domain.world_model, tasks or domain.tasks, cfg.domain.image_size,
                     max_steps=cfg.domain.max_steps, **kwargs)  # fmt: skip


def generate(d: VLADomain, n_groups: int, seed: int = 0, group_size: int = 4):
    d.gen.manual_seed(seed)
    tasks = d.sample_tasks(n_groups, "train", torch.Generator().manual_seed(seed))
    return d.generate(tasks, group_size, torch.ones(n_groups, dtype=torch.bool))


def test_bounded_steps_run_the_same_rollouts_in_chunks(vla_debug, monkeypatch):
    """Default: one lockstep call of all 12 rollouts (today's); a bound of 5: calls of 5, 5, 2 over
    the same tasks and seeds, and a greedy policy's rollouts are the very same."""
    import wmrl_vla.rollout as rollout

    sizes = []
    real = rollout.run_episodes

    def record(actor, specs, pool, split, noise=None):
        sizes.append(len(specs))
        return real(actor, specs, pool, split, noise=noise)

    monkeypatch.setattr(rollout, "run_episodes", record)
    batches = {}
    for bound in (None, 5):
        d = domain_of(vla_debug, temperature=0.0, rollout_lockstep=bound)
        try:
            batches[bound] = generate(d, 3)
        finally:
            d.pool.close()
    assert sizes == [12, 5, 5, 2]
    whole, chunked = batches[None].payload, batches[5].payload
    assert [(p["task_id"], p["seed"]) for p in chunked] == [(p["task_id"], p["seed"]) for p in whole]
    for a, b in zip(whole, chunked, strict=True):
        assert len(a["actions"]) == len(b["actions"])
        np.testing.assert_array_equal(a["actions"], b["actions"])
        assert a["reward"] == b["reward"]


def test_twin_noise_is_sliced_with_the_chunks(vla_debug):
    """With twin anchors each real rollout samples from its own uniforms, so chunking changes none
    of its actions (a chunk handed another chunk's uniforms would)."""
    payloads = {}
    for bound in (None, 3):
        d = domain_of(vla_debug, twin_anchors=True, rollout_lockstep=bound)
        try:
            batch = generate(d, 2, seed=4)
        finally:
            d.pool.close()
        payloads[bound] = [p for p in batch.payload if p["kind"] == "sim"]
    assert len(payloads[None]) == 8
    for a, b in zip(payloads[None], payloads[3], strict=True):
        np.testing.assert_array_equal(a["bins"], b["bins"])
    assert len({p["bins"][0].tobytes() for p in payloads[3]}) > 1  # sampled, not greedy


def test_the_pool_never_holds_more_envs_than_the_bound(vla_debug, live_envs):
    """Two own tasks (their envs not interchangeable) and both splits: a step of 16 rollouts and an
    evaluation never have more than max(rollout_lockstep, eval_lockstep) envs alive at once."""
    ev = VLAEvaluation(temperature=0.0, episodes_per_task=3, lockstep=3, n_videos=0)
    d = domain_of(vla_debug, TWO_TASKS, rollout_lockstep=5, evaluation=ev)
    try:
        batch = generate(d, 4, seed=2)
        assert {p["task_id"] for p in batch.payload} == set(TWO_TASKS)
        d.evaluate("eval")
        generate(d, 4, seed=3)
    finally:
        d.pool.close()
    assert live_envs["peak"] == 5 and live_envs["live"] == 0
    assert live_envs["built"] > 5  # envs of another task or split were closed to make room
    # unbounded, the same step holds one env per rollout
    d = domain_of(vla_debug, TWO_TASKS)
    try:
        generate(d, 4, seed=2)
    finally:
        d.pool.close()
    assert live_envs["peak"] == 16


def test_the_default_pool_holds_no_more_envs_than_it_lent_at_once(vla_debug, live_envs):
    """Without a bound the pool holds at most the most envs lent at once (here a step's 12
    rollouts): idle envs of another task or split make room instead of piling up per (task, split)
    as they did (a pool that keeps every env it built: each task's largest step, and evaluation's
    envs of the held-out split beside them), and the steps and the evaluation are the very same."""
    ev = VLAEvaluation(temperature=0.0, episodes_per_task=3, lockstep=4, n_videos=0)
    runs = {}
    for capacity in (None, 10**9):  # the default; a pool that never closes an env
        d = domain_of(vla_debug, TWO_TASKS, evaluation=ev)
        d.pool.capacity = capacity
        try:
            batches = [generate(d, 3, seed=s) for s in (2, 3)]
            scores = d.evaluate("eval")
            batches.append(generate(d, 3, seed=2))
            runs[capacity] = (batches, scores, d.pool.live)
        finally:
            d.pool.close()
    mixes = [sorted(p["task_id"] for p in b.payload) for b in runs[None][0][:2]]
    assert mixes[0] != mixes[1]  # the two steps split their 12 rollouts differently between the tasks
    assert runs[None][2] == 12 < runs[10**9][2]
    for a, b in zip(runs[None][0], runs[10**9][0], strict=True):
        for pa, pb in zip(a.payload, b.payload, strict=True):
            np.testing.assert_array_equal(pa["actions"], pb["actions"])
            assert pa["reward"] == pb["reward"]
    assert runs[None][1] == runs[10**9][1]


def test_envs_whose_split_changes_nothing_serve_every_split(live_envs):
    """MetaWorld envs (lerobot's too) hold nothing out by split: training and evaluation share them;
    our own tasks' envs are kept per split."""
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task

    lerobot = register_task(LeRobotEnvConfig(type="metaworld", task="reach-v3", episode_length=5))
    assert EnvPool.key(lerobot, "test") == EnvPool.key(lerobot, "train") == (lerobot, "all")
    assert EnvPool.key("wmrl/MetaWorld-reach-v3", "test") == ("wmrl/MetaWorld-reach-v3", "all")
    assert EnvPool.key(TWO_TASKS[0], "test") == (TWO_TASKS[0], "test")
    pool = EnvPool(32)
    env = pool.get(lerobot, "train")
    pool.put(lerobot, "train", env)
    assert pool.get(lerobot, "test") is env and live_envs["built"] == 1
    pool.put(lerobot, "test", env)
    pool.close()


@pytest.mark.parametrize(
    "task_id", ["wmrl/MetaWorld-reach-v3", "lerobot/metaworld-reach-v3", "wmrl/PushColor-v0"]
)
def test_a_reused_env_replays_a_fresh_ones_episode(task_id):
    """What sharing envs across steps and splits, and closing idle ones to build another task's,
    rests on: a reset with a seed restores the episode exactly, whatever the env ran before."""
    import sims
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task

    register_task(LeRobotEnvConfig(type="metaworld", task="reach-v3", episode_length=8))
    actions = np.random.default_rng(0).uniform(-1, 1, (8, 4)).astype(np.float32)

    def episode(env, seed):
        o, _ = env.reset(seed=seed)
        frames, states = [o["image"]], [o["state"]]
        for a in actions:
            o, *_ = env.step(a)
            frames.append(o["image"])
            states.append(o["state"])
        return np.stack(frames), np.stack(states)

    fresh, used = (sims.make(task_id, image_size=32, max_steps=8) for _ in range(2))
    try:
        episode(used, 5)
        want, got = episode(fresh, 7), episode(used, 7)
    finally:
        fresh.close()
        used.close()
    np.testing.assert_array_equal(want[0], got[0])
    np.testing.assert_array_equal(want[1], got[1])


def test_bad_bounds_are_refused_in_one_line(vla_debug):
    from wmrl.config import ConfigError, load_config

    with pytest.raises(
        ConfigError, match=r"^domain.rollout_lockstep=0 must be >= 1 \(or null: all of a step's"
    ):
        load_config("vla-debug", ["--domain.rollout_lockstep=0"])
    assert load_config("vla-debug", ["--domain.rollout_lockstep=16"]).domain.rollout_lockstep == 16
    assert load_config("vla-debug", []).domain.rollout_lockstep is None
    with pytest.raises(ValueError, match=r"^rollout_lockstep=-1 must be >= 1"):
        domain_of(vla_debug, rollout_lockstep=-1)
    with pytest.raises(ValueError, match=r"^EnvPool capacity=0 must be >= 1"):
        EnvPool(32, capacity=0)
    pool = EnvPool(32, capacity=1)
    env = pool.get(TWO_TASKS[0], "train")
    with pytest.raises(RuntimeError, match="all 1 envs of its capacity are in use"):
        pool.get(TWO_TASKS[1], "train")
    pool.put(TWO_TASKS[0], "train", env)
    pool.close()


def test_the_built_domain_takes_the_bound_from_its_config(vla_debug, tmp_path):
    from wmrl.config import load_config

    _, _, root = vla_debug
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={tmp_path / 'run'}", f"--domain.cache_dir={root / 'cache'}",
         "--domain.rollout_lockstep=3", "--domain.eval_lockstep=2"],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        assert domain.rollout_lockstep == 3 and domain.pool.capacity == 3
    finally:
        domain.close()
