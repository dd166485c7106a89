"""The research Domain on real tasks, the real sandbox and the debug preset (tiny policy, small log)."""

import ast
import json
import time

import pytest
import torch

from wmrl.config import ConfigError, load_config
from wmrl.domain import RolloutBatch
from wmrl_research.domain import EditRollout, rejected_job
from wmrl_research.edits import knob_edit, knobs_block, parse_knobs
from wmrl_research.grading import graded_reward
from wmrl_research.tasks import FAILURE_SCORE, get_task


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("research")
    cfg = load_config(
        "research-debug",
        [
            f"--domain.cache_dir={root / 'cache'}",
            f"--out_dir={root / 'run'}",
            "--domain.sft_steps=10",
            "--domain.wm_pretrain_steps=20",
        ],
    )
    return cfg, cfg.domain.build(cfg)


def manual_batch(domain, edits: list[str | None]) -> RolloutBatch:
    """A batch of hand-written edits of wine_cls (None: an edit that does not apply)."""
    task = get_task("iris_cls")
    payload = []
    for e in edits:
        if e is None:
            payload.append(EditRollout(task.id, "no edit here", None, "no search/replace block found"))
        else:
            from wmrl_research.edits import apply_edits

            res = apply_edits(task.baseline_source, e, "knobs")
            assert res.ok, res.reason
            payload.append(EditRollout(task.id, e, res.source))
    n = len(edits)
    z = torch.zeros(n, 3)
    return RolloutBatch(z.long(), z, z, torch.zeros(n, dtype=torch.long), [task], payload)


def test_build_is_cached_and_records_figures(built):
    cfg, domain = built
    info = domain.build_info
    assert {"sft", "log", "wm", "sft_eval"} <= set(info)
    assert info["log"]["n"] >= 1 and 0 <= info["sft"]["validity_train"]["apply_fraction"] <= 1
    # the random-edit log (8 per task in the debug preset) is reported apart from the SFT samples
    rnd = info["log"]["random"]
    assert rnd["executions"] == 8 and rnd["n"] == 8 and info["log"]["n"] == info["log"]["sft_samples"] + 8
    t0 = time.perf_counter()
    again = cfg.domain.build(cfg)
    assert time.perf_counter() - t0 < 20
    for a, b in zip(domain.policy.state_dict().values(), again.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert json.loads(json.dumps(again.build_info["sft"])) == json.loads(json.dumps(info["sft"]))


def test_generate_applies_edits_and_keeps_log_probs(built):
    _, domain = built
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(0))
    batch = domain.generate(tasks, 3, torch.tensor([True, False]))
    assert batch.n_rollouts == 6 and batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.extras["prompt_ids"].shape[0] == 6
    # the debug preset decodes SEARCH texts under the knob-line constraint: its masks ride along
    assert domain.policy.search_constraint and batch.extras["search_constrained"].shape == batch.tokens.shape
    assert batch.extras["search_allowed"].shape[:2] == batch.tokens.shape
    lp = domain.policy.log_probs(batch)
    torch.testing.assert_close(lp * batch.mask, batch.logprobs, atol=1e-4, rtol=1e-4)
    for p, t in zip(batch.payload, [t for t in tasks for _ in range(3)], strict=True):
        assert p.task_id == t.id and (p.source is None) == bool(p.reason)


def test_execution_jobs_real_sandbox_and_rejections(built):
    _, domain = built
    task = get_task("iris_cls")
    ref_knobs = parse_knobs(knobs_block(task.reference_source))
    # the reference solution, written as an edit of the baseline
    ref = knob_edit(task.baseline_source, {k: ast.literal_eval(v) for k, v in ref_knobs.items()})
    batch = manual_batch(domain, [ref, None])
    jobs = domain.execution_jobs(batch, [0, 1])
    assert jobs[0].fn is graded_reward and jobs[0].args[:2] == ("iris_cls", batch.payload[0].source)
    assert jobs[1].fn is rejected_job and jobs[1].args == ()
    before = domain.step_metrics()  # what earlier tests executed
    r = domain.execute(batch)
    assert r[0].item() == pytest.approx(1.0, abs=1e-6) and r[1].item() == FAILURE_SCORE
    # training's executions so far by outcome: one more ran ok, one more was rejected
    after = domain.step_metrics()
    assert set(after) == {f"exec_{o}" for o in ("ok", "error", "timeout", "invalid", "killed", "rejected")}
    added = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert added == {"exec_ok": 1.0, "exec_rejected": 1.0}


def counts_as_outcomes(counts: dict[str, float]) -> dict[str, int]:
    return {k.removeprefix("exec_"): int(v) for k, v in counts.items() if v}


def test_an_execution_stopped_at_the_wall_clock_limit_is_counted_and_warned(built, monkeypatch, caplog):
    """A solution that outlives the sandbox's limit earns the failure score; the run counts it
    (``domain/exec_timeout``) and warns, since on a loaded machine the limit may be the machine's."""
    _, domain = built
    task = get_task("iris_cls")
    slow = "import time\ntime.sleep(60)\n" + task.baseline_source
    batch = manual_batch(domain, [None])
    batch.payload[0] = EditRollout(task.id, "sleeps", slow)
    monkeypatch.setattr(domain, "timeout_s", 1.0)
    state = domain.state_dict()
    with caplog.at_level("WARNING", logger="wmrl"):
        r = domain.execute(batch)
    assert r.tolist() == [FAILURE_SCORE]
    counts = domain.step_metrics()
    assert counts["exec_timeout"] == state["outcomes"].get("timeout", 0) + 1
    # a checkpoint keeps the counts: resumed from the state before, the timeout is not counted
    domain.load_state_dict(state)
    assert domain.step_metrics()["exec_timeout"] == counts["exec_timeout"] - 1
    domain.load_state_dict({**state, "outcomes": counts_as_outcomes(counts)})
    assert domain.step_metrics() == counts
    assert "1 of 1 executions hit the sandbox's 1 s wall-clock limit" in caplog.text
    assert "--domain.sandbox_timeout_s" in caplog.text


def test_world_model_scores_rejections_exactly_and_learns_online(built):
    _, domain = built
    wm = domain.world_model
    edits = [knob_edit(get_task("iris_cls").baseline_source, {"C": c}) for c in (0.01, 1.0)]
    batch = manual_batch(domain, [edits[0], None, edits[1]])
    pred = wm.predict(batch)
    assert pred.mean[1].item() == FAILURE_SCORE and pred.var[1].item() < 1e-5
    assert torch.isfinite(pred.mean).all() and (pred.var > 0).all()
    n_log = len(wm.log)
    n_train = len(wm.model.examples)
    target = torch.tensor([0.5, float("nan"), 1.0])
    for _ in range(3):
        stats = wm.update(batch, torch.tensor([0, 1, 2]), target)
    assert stats["update_examples"] == 2.0  # the rejection and nothing ungraded is logged
    assert len(wm.log) == n_log + 6 and len(wm.model.examples) == n_train + 6
    after = wm.predict(batch)
    assert (after.mean[[0, 2]] - torch.tensor([0.5, 1.0])).abs().sum() < (
        pred.mean[[0, 2]] - torch.tensor([0.5, 1.0])
    ).abs().sum()


def test_state_round_trip_and_evaluate(built):
    _, domain = built
    state = domain.state_dict()
    a = domain.generate(
        domain.sample_tasks(1, "train", torch.Generator().manual_seed(0)), 2, torch.tensor([False])
    )
    domain.load_state_dict(state)
    b = domain.generate(
        domain.sample_tasks(1, "train", torch.Generator().manual_seed(0)), 2, torch.tensor([False])
    )
    assert torch.equal(a.tokens, b.tokens)
    ev = domain.evaluate("eval")
    assert {"score_mean", "runnable_frac", "apply_frac", "baseline_score_mean", "sft_score_mean"} <= set(ev)
    assert FAILURE_SCORE <= ev["score_mean"] <= 2.0 and 0 <= ev["runnable_frac"] <= 1
    assert 0 <= ev["timeout_frac"] <= ev["runnable_frac"] + ev["timeout_frac"] <= 1
    assert domain.oracle_rewards(a) is None


def test_the_built_policys_evaluation_is_reused_until_a_parameter_changes(built, monkeypatch):
    _, domain = built
    executed = []
    monkeypatch.setattr(
        domain,
        "_run",
        lambda batch, indices: (
            executed.append(batch) or (torch.zeros(batch.n_rollouts), ["ok"] * batch.n_rollouts)
        ),
    )
    sft = domain.build_info["sft_eval"]
    assert domain.evaluate("eval") == {**sft, **domain.reference_scores} and not executed
    domain.evaluate("train")  # another split is evaluated
    assert len(executed) == 1
    p = next(domain.policy.parameters())
    with torch.no_grad():
        p.add_(1e-3)
    try:
        assert domain.evaluate("eval")["score_mean"] == 0.0 and len(executed) == 2  # a changed policy runs
    finally:
        with torch.no_grad():
            p.sub_(1e-3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_model": "gpt"}, "domain.world_model='gpt'"),
        ({"edit_mode": "free"}, "prompt_style='short' needs"),
        ({"lora": True}, "LoRA needs a pretrained model"),
        ({"tiny_hidden": 30}, "multiple of 4"),
    ],
)
def test_config_errors_name_the_field(kwargs, message):
    from wmrl_research.config import ResearchConfig

    with pytest.raises(ConfigError, match=message):
        ResearchConfig(**kwargs)
    with pytest.raises(ConfigError):
        load_config("research-debug", [f"--domain.{k}={v}" for k, v in kwargs.items()])


def test_sharded_generation_joins_into_a_batch_the_policy_scores(built):
    """Data-parallel ``generation=shard``: two ranks' shares (reseeded by ``shard_rng``, so they draw
    independent edits) have prompts and completions of different lengths; joined with the domain's
    ``extras_padding`` (prompts left-padded), the policy re-scores every rollout as its rank did."""
    from wmrl.distributed import join_shares

    _, domain = built
    tasks = [domain.train_tasks[0], *domain.eval_tasks[:2]]
    parts = []
    for rank, share in ((0, tasks[:2]), (1, tasks[2:])):
        domain.shard_rng(rank, step=5)
        parts.append((domain.generate(share, 2, torch.zeros(len(share), dtype=torch.bool)), len(share)))
    domain.shard_rng(0, step=5)
    again = domain.generate(tasks[:2], 2, torch.zeros(2, dtype=torch.bool))
    assert torch.equal(again.tokens, parts[0][0].tokens)  # (seed, step, rank) fixes the draw
    shapes = [(b.extras["prompt_ids"].shape[1], b.tokens.shape[1]) for b, _ in parts]
    assert len(set(shapes)) == 2, shapes  # the shares' paddings differ
    batch, _, src_rank, src_row = join_shares(parts, domain.extras_padding)
    assert [t.id for t in batch.tasks] == [t.id for t in tasks]
    lp = domain.policy.log_probs(batch)
    for r, (part, _) in enumerate(parts):
        rows = (src_rank == r).nonzero().squeeze(-1)
        t = part.tokens.shape[1]
        torch.testing.assert_close(
            lp[rows, :t] * part.mask[src_row[rows]], part.logprobs[src_row[rows]], atol=1e-4, rtol=1e-4
        )
        assert not batch.mask[rows, t:].any()


def test_rollout_media_is_a_table_of_edits_with_predicted_and_true_scores(built):
    _, domain = built
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(0))
    batch = domain.generate(tasks, 3, torch.tensor([True, False]))
    pred = domain.world_model.predict(batch).mean
    true = torch.full((6,), float("nan"))
    true[:3] = domain.execute(batch, [0, 1, 2])
    table = domain.rollout_media(batch, pred, true)["rollouts/edits"]
    assert table.columns == ["task", "group", "edit", "applied", "reason", "predicted", "true"]
    assert [r[2] for r in table.rows] == [p.completion for p in batch.payload]
    assert [r[5] for r in table.rows] == pytest.approx(pred.tolist())
    assert [r[6] for r in table.rows[:3]] == pytest.approx(true[:3].tolist()) and table.rows[3][6] is None


@pytest.mark.slow
def test_training_runs_on_the_domains_pool_and_close_stops_it(built):
    """One pool of sandbox workers per run: the trainer executes its anchors on the domain's
    (evaluation) executor instead of starting a second pool, and leaves it running for the
    evaluations after training. A process that built the domain must be able to exit: close() stops
    the pool (a grid worker that prepared research-tiny hung at its exit, joining the pool's children)."""
    from wmrl.trainer import Trainer

    cfg, _ = built
    cfg = load_config("research-debug", [
        f"--domain.cache_dir={cfg.domain.cache_dir}", f"--out_dir={cfg.out_dir}-process",
        "--domain.sft_steps=10", "--domain.wm_pretrain_steps=20", "--executor.type=process",
        "--anchors.max_concurrent=1", "--grpo.steps=1", "--tracking.eval_every=0",
    ])  # fmt: skip
    domain = cfg.domain.build(cfg)
    pool = domain.executor._pool
    trainer = Trainer(cfg, domain)
    trainer.train()
    assert trainer.executor is domain.executor and trainer.real_executions > 0
    # the trainer handed its executions' outcomes to the domain: each counted once (none ungraded)
    assert sum(domain.step_metrics().values()) == trainer.real_executions
    assert pool.active  # training did not close the domain's pool
    assert domain.execute(manual_batch(domain, [None])).shape == (1,)
    domain.close()
    assert not pool.active


def test_each_seed_trains_its_own_start(tmp_path):
    """The research domain declares START_PER_SEED, and it is true: the SFT policy every method
    starts from is trained with the run seed, so two seeds start from different weights (a grid
    records one start per seed for it, tests/core/test_compare.py)."""
    from wmrl.domain import check_domain_config
    from wmrl.tracking import policy_fingerprint
    from wmrl_research.pipeline import build_policy, policy_cache, select_tasks

    digests = []
    for seed in (0, 1):
        cfg = load_config("research-debug", [
            f"--domain.cache_dir={tmp_path / 'cache'}", f"--out_dir={tmp_path / 'run'}",
            "--domain.sft_steps=2", f"--seed={seed}",
        ])  # fmt: skip
        train, heldout = select_tasks(cfg.domain)
        policy, _ = build_policy(cfg.domain, cfg, train, heldout, policy_cache(cfg.domain, cfg))
        digests.append(policy_fingerprint(policy))
    assert check_domain_config(cfg.domain).start_per_seed is True
    assert digests[0] != digests[1]
