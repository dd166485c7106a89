"""The outcome-WM kind field (domain.world_model), the knob surrogate on real tasks through the
domain's WM, and the random-edit execution log (built through the real sandbox, cached)."""

import random

import pytest
import torch

from wmrl.config import ConfigError, ExecutorConfig, RunConfig, load_config
from wmrl.domain import RolloutBatch
from wmrl.executors import make_executor
from wmrl_research.config import WORLD_MODELS, ResearchConfig
from wmrl_research.domain import EditRollout, ResearchWorldModel, to_example
from wmrl_research.edits import knobs_block, parse_knobs
from wmrl_research.execution_logs import build_random_log, random_edit_sources, random_log_path
from wmrl_research.pipeline import build_world_model
from wmrl_research.tasks import get_task, list_tasks
from wmrl_research.wm_kinds import surrogate_tasks
from world_models.knob_surrogate import KnobSurrogateOutcomeModel
from world_models.outcome import EncoderOutcomeModel


def test_the_field_selects_the_kind_and_unknown_kinds_list_the_known_ones(tmp_path):
    assert ResearchConfig().world_model == "surrogate" and WORLD_MODELS[0] == "surrogate"
    run = RunConfig(seed=0)
    sur = build_world_model(ResearchConfig(world_model="surrogate"), run)
    hgb = build_world_model(ResearchConfig(world_model="surrogate_hgb"), run)
    assert isinstance(sur, KnobSurrogateOutcomeModel) and sur.estimator == "extra_trees"
    assert isinstance(hgb, KnobSurrogateOutcomeModel) and hgb.estimator == "hgb"
    from world_models.code_outcome import CodeOutcomeModel

    code = build_world_model(ResearchConfig(world_model="code", cache_dir=str(tmp_path)), run)
    assert isinstance(code, CodeOutcomeModel)  # no tokenizer: it brings its own encoder
    from wmrl_research.lm import build_tokenizer

    tok = build_tokenizer(["MODEL = 1\nALPHA = 2\n"] * 4, vocab_size=300)
    assert isinstance(build_world_model(ResearchConfig(world_model="encoder"), run, tok), EncoderOutcomeModel)
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        build_world_model(ResearchConfig(world_model="encoder"), run)
    with pytest.raises(ConfigError, match="surrogate, surrogate_hgb, code, encoder, lm"):
        ResearchConfig(world_model="gp")
    with pytest.raises(ConfigError, match="domain.world_model='gp'"):
        load_config("research-tiny", ["--domain.world_model=gp"])
    assert load_config("research-tiny", ["--domain.world_model=encoder"]).domain.world_model == "encoder"


def test_random_edits_change_one_to_three_knobs_within_their_space():
    rng = random.Random(0)
    for task in list_tasks("train"):
        base = parse_knobs(knobs_block(task.baseline_source))
        srcs = random_edit_sources(task, 12, rng)
        counts = set()
        for src in srcs:
            knobs = parse_knobs(knobs_block(src))
            changed = [k for k in knobs if knobs[k] != base[k]]
            counts.add(len(changed))
            assert all(k in task.knob_space for k in changed)
            assert src.replace(knobs_block(src), "") == task.baseline_source.replace(
                knobs_block(task.baseline_source), ""
            )  # only the knobs block differs
        assert counts <= {1, 2, 3} and len(counts) >= (2 if len(task.knob_space) > 2 else 1)


class _CountingExecutor:
    """The real inline executor, counting the jobs it is given."""

    def __init__(self):
        self.inner = make_executor(ExecutorConfig(type="inline"), 1)
        self.jobs = 0

    def run(self, jobs):
        self.jobs += len(jobs)
        return self.inner.run(jobs)


def test_random_log_is_executed_once_cached_and_keyed(tmp_path):
    cfg = ResearchConfig(log_random_per_task=3, cache_dir=str(tmp_path), train_tasks=["iris_cls"])
    train = [get_task("iris_cls")]
    path = random_log_path(cfg, train)
    ex = _CountingExecutor()
    records = build_random_log(cfg, train, ex, path).load()
    assert ex.jobs == 3 and len(records) == 3 and {r.source for r in records} == {"random"}
    assert all(r.task_id == "iris_cls" and -1 <= r.reward <= 2 for r in records)
    assert build_random_log(cfg, train, ex, path).load() == records and ex.jobs == 3  # cached
    assert path.with_suffix(".json").exists()
    other = ResearchConfig(log_random_per_task=4, cache_dir=str(tmp_path))
    assert random_log_path(other, train) != path
    assert (
        random_log_path(
            ResearchConfig(log_random_per_task=3, log_random_seed=1, cache_dir=str(tmp_path)), train
        )
        != path
    )
    # the same log for any policy or run seed: nothing but the tasks, size, seed and timeout enter
    assert (
        random_log_path(
            ResearchConfig(log_random_per_task=3, cache_dir=str(tmp_path), policy="smollm2"), train
        )
        == path
    )


def test_domain_wm_with_the_surrogate_ranks_and_refines_on_anchors(tmp_path):
    task = get_task("iris_cls")
    rng = random.Random(0)

    # a known response: C up is good, MAX_ITER=20 is bad
    def truth(src):
        k = parse_knobs(knobs_block(src))
        return 0.3 * task.knob_space["C"].index(float(k["C"])) - 0.5 * (k["MAX_ITER"] == "20")

    srcs = random_edit_sources(task, 40, rng)
    model = KnobSurrogateOutcomeModel(surrogate_tasks([task]), trees=50, min_fit=4)
    model.fit([to_example(task, s, truth(s), "random") for s in srcs[:30]])
    wm = ResearchWorldModel(model, {task.id: task}, None, update_steps=1, wm_input="edit")
    test = srcs[30:]
    n = len(test) + 1
    batch = RolloutBatch(
        torch.zeros(n, 3).long(), torch.zeros(n, 3), torch.zeros(n, 3), torch.zeros(n, dtype=torch.long),
        [task], [EditRollout(task.id, "e", s) for s in test] + [EditRollout(task.id, "x", None, "rejected")],
    )  # fmt: skip
    pred = wm.predict(batch)
    assert pred.mean[-1].item() == -1.0  # a rejected edit scores the failure score exactly
    from scipy.stats import spearmanr

    assert spearmanr(pred.mean[:-1].numpy(), [truth(s) for s in test]).statistic > 0.8
    # anchors that contradict the log move the predictions of those edits
    before = pred.mean[:3].clone()
    info = wm.update(batch, torch.arange(3), torch.full((3,), 1.5))
    assert info["update_examples"] == 3.0
    after = wm.predict(batch).mean[:3]
    assert bool((after > before + 0.2).all()), (before, after)
    # the surrogate read the edit view (wm_input=edit), the log view never reached it
    assert all("(was " in e.solution_text for e in model.examples[-3:])


def test_prior_anchor_groups_are_scored_out_of_fold_per_task_and_cached(tmp_path):
    """ppi.prior_from_log's groups: the logged SFT samples of each task (baselines left out) in
    groups of grpo.group_size, each scored by a surrogate that never saw it. Rewards here are noise,
    which a fully grown tree reproduces on its training rows and cannot predict elsewhere."""
    from wmrl_research.pipeline import prior_anchor_groups

    rng = random.Random(0)
    tasks = list_tasks("train")[:2]
    sft, randoms = [], []
    for t in tasks:
        sft += [to_example(t, s, rng.random(), "log") for s in random_edit_sources(t, 8, rng)]
        randoms += [to_example(t, s, rng.random(), "random") for s in random_edit_sources(t, 16, rng)]
    log = sft + [to_example(t, t.baseline_source, 0.0, "log", "ok") for t in tasks]
    cfg, run = ResearchConfig(world_model="surrogate"), RunConfig(seed=0)
    groups = prior_anchor_groups(cfg, run, log, randoms, tmp_path, "log.jsonl")
    size = run.grpo.group_size
    assert len(groups) == 2 * 8 // size and all(len(h) == len(r) == size for h, r in groups)
    assert [r for _, r in groups] == [[e.reward for e in sft[k : k + size]] for k in range(0, len(sft), size)]
    r_hat = torch.tensor([h for h, _ in groups]).flatten()
    r = torch.tensor([e.reward for e in sft])
    in_sample = build_world_model(cfg, run)
    in_sample.fit(randoms + sft, 0)
    mean, _ = in_sample.predict([e.task_text for e in sft], [e.solution_text for e in sft])
    # in sample: exact (but for edits drawn twice); out of fold: about E|U - U'| = 1/3 away
    assert (mean - r).abs().median() < 1e-6 and (r_hat - r).abs().mean() > 0.15
    assert prior_anchor_groups(cfg, run, [], [], tmp_path, "log.jsonl") == groups  # cached
