"""Free-form edits (``domain.edit_mode=free``): SEARCH/REPLACE blocks anywhere in solution.py, from the
prompt and SFT data to a ``wmrl run`` whose anchors execute edits outside the knobs block."""

import json
import math
import random

import pytest
import torch
import yaml

from wmrl.cli import main as wmrl_main
from wmrl.config import load_config
from wmrl.domain import RolloutBatch
from wmrl_research.code_edits import code_log_path
from wmrl_research.domain import EditRollout, ResearchWorldModel, solution_text
from wmrl_research.edits import apply_edits, knobs_block, knobs_span, parse_edits
from wmrl_research.execution_logs import random_log_path
from wmrl_research.pipeline import select_tasks
from wmrl_research.prompts import build_prompt
from wmrl_research.sft import sft_examples
from wmrl_research.tasks import FAILURE_SCORE, get_task
from world_models.outcome import ExecutionLog

IRIS = get_task("iris_cls")
FIT = "    model = LogisticRegression(C=C, max_iter=MAX_ITER).fit(X_train, y_train)"


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def outside_knobs(source: str, edited: str) -> bool:
    """Whether ``edited`` differs from ``source`` outside the knobs block."""
    lo, hi = knobs_span(source)
    lo2, hi2 = knobs_span(edited)
    return (source[:lo], source[hi:]) != (edited[:lo2], edited[hi2:])


def test_free_blocks_parse_in_order_and_apply_outside_the_knobs_block():
    text = "I will scale the features.\n" + block(FIT, FIT.replace("C=C,", "C=C * 10,")) + "\n"
    text += block("MAX_ITER = 100", "MAX_ITER = 200") + "\ndone"
    assert [e.search for e in parse_edits(text)] == [FIT, "MAX_ITER = 100"]
    res = apply_edits(IRIS.baseline_source, text, "free")
    assert res.ok and res.n_edits == 2
    assert "LogisticRegression(C=C * 10, max_iter=MAX_ITER)" in res.source and "MAX_ITER = 200" in res.source
    assert outside_knobs(IRIS.baseline_source, res.source)
    knobs = apply_edits(IRIS.baseline_source, text, "knobs")
    assert not knobs.ok and knobs.reason == "block 0: edits outside the knobs block (mode 'knobs')"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("the model is fine as it is", "no search/replace block found"),
        (f"<<<<<<< SEARCH\n{FIT}\n=======\n", "unterminated search/replace block"),
        (block("    model = Ridge()", "    model = Lasso()"), "block 0: SEARCH text not found in the solution"),
        (block('    X_val, y_val = load("val")', '    X_val, y_val = load("val"'),
         "the edited solution is not valid Python: '(' was never closed (line 23)"),
        (block(FIT, FIT) + "\n" + block("import os", "import os\n  import sys"),
         "the edited solution is not valid Python: unexpected indent (line 4)"),
        (block("load", "read"), "block 0: SEARCH text occurs 5 times (must be unique)"),
    ],
)  # fmt: skip
def test_a_free_edit_that_does_not_apply_or_parse_fails_with_its_reason(text, reason):
    res = apply_edits(IRIS.baseline_source, text, "free")
    assert not res.ok and res.source is None and res.reason.startswith(reason), res.reason


def test_rejected_anchor_edits_are_logged_with_their_reason_and_never_learnt(tmp_path):
    bad = apply_edits(IRIS.baseline_source, block("model = Ridge()", "x"), "free")
    rows = [EditRollout(IRIS.id, "no block at all", None, "no search/replace block found"),
            EditRollout(IRIS.id, block("model = Ridge()", "x"), None, bad.reason)]  # fmt: skip
    batch = RolloutBatch(
        tokens=torch.zeros(2, 1, dtype=torch.long), logprobs=torch.zeros(2, 1), mask=torch.ones(2, 1),
        group_ids=torch.zeros(2, dtype=torch.long), tasks=[IRIS], payload=rows,
    )  # fmt: skip
    log = ExecutionLog(tmp_path / "execution_log.jsonl")
    wm = ResearchWorldModel(None, {IRIS.id: IRIS}, log, update_steps=1)  # no model: nothing to learn
    out = wm.update(batch, torch.tensor([0, 1]), torch.tensor([FAILURE_SCORE, FAILURE_SCORE]))
    assert out == {"update_examples": 0.0}
    recs = log.load()
    assert [(r.source, r.status, r.reward) for r in recs] == [
        ("rejected", "rejected: no search/replace block found", FAILURE_SCORE),
        ("rejected", "rejected: block 0: SEARCH text not found in the solution", FAILURE_SCORE),
    ]
    assert recs[1].solution_text == rows[1].completion


def test_free_mode_prompts_show_the_program_and_sft_targets_are_code_edits_that_apply():
    prompt = build_prompt(IRIS, IRIS.baseline_source, "free")
    assert FIT in prompt and "Edit any lines of solution.py." in prompt
    pairs = sft_examples([IRIS], 40, random.Random(0), mode="free")
    assert all(p == prompt for p, _ in pairs)
    edited = [apply_edits(IRIS.baseline_source, c, "free") for _, c in pairs]
    assert all(r.ok for r in edited)
    outside = sum(outside_knobs(IRIS.baseline_source, r.source) for r in edited)
    assert outside == len(pairs)  # every target mutates code; about half change a knob as well
    assert 0 < sum(knobs_block(r.source) != knobs_block(IRIS.baseline_source) for r in edited) < len(pairs)
    knob_pairs = sft_examples([IRIS], 10, random.Random(0))
    assert all(not apply_edits(IRIS.baseline_source, c, "knobs").reason for _, c in knob_pairs)


def test_edit_mode_free_is_one_switch_for_the_wm_and_the_random_log():
    free = load_config("research-debug", ["--domain.edit_mode=free", "--domain.prompt_style=full"])
    knobs = load_config("research-debug", [])
    assert (free.domain.world_model, knobs.domain.world_model) == ("code", "surrogate")
    explicit = load_config("research-debug", ["--domain.edit_mode=free", "--domain.prompt_style=full",
                                              "--domain.world_model=surrogate"])  # fmt: skip
    assert explicit.domain.world_model == "surrogate"
    d = free.domain
    train, _ = select_tasks(d)
    assert random_log_path(d, train) == code_log_path(
        d.cache_dir, train, d.log_random_per_task, d.log_random_seed, d.sandbox_timeout_s
    )
    assert random_log_path(knobs.domain, train).name.startswith("random_log-")
    big = load_config("research-free", [])
    assert (big.domain.policy, big.domain.lora, big.domain.edit_mode, big.domain.world_model) == (
        "smollm2",
        True,
        "free",
        "code",
    )


@pytest.fixture(scope="module")
def free_run(tmp_path_factory):
    """``wmrl run research-free-tiny``: SFT on code edits, the code-edit log, the code WM, 2 ppi steps
    whose anchors run in the sandbox."""
    tmp = tmp_path_factory.mktemp("free")
    argv = ["run", "research-free-tiny", "--out-dir", str(tmp / "run"), f"--domain.cache_dir={tmp / 'cache'}"]
    assert wmrl_main(argv) == 0
    return tmp / "run"


def code_diff(record) -> bool:
    """Whether a log record's solution changes lines outside the knobs block (its ``-``/``+`` lines)."""
    return any(line[:1] in "+-" for line in record.solution_text.splitlines())


@pytest.mark.slow
def test_a_tiny_free_form_run_executes_and_scores_edits_outside_the_knobs_block(free_run):
    assert yaml.safe_load((free_run / "config.yaml").read_text())["domain"]["world_model"] == "code"
    rows = [json.loads(line) for line in open(free_run / "metrics.jsonl")]
    assert len(rows) == 2 and all(r["exec/step"] > 0 for r in rows)
    records = ExecutionLog(free_run / "execution_log.jsonl").load()
    # the WM pretrained on random code mutations (the code log) and the SFT samples with the baseline
    assert any(r.source == "code" and code_diff(r) for r in records)
    # ... and the run says how many executions that took, apart from the RL budget (for the report)
    pretraining = [r for r in records if r.source in ("code", "log")]
    assert json.loads((free_run / "offline_data.json").read_text()) == {"executions": len(pretraining)}
    assert solution_text(IRIS, IRIS.baseline_source) in {
        r.solution_text for r in records if r.source == "log"
    }
    anchors = [r for r in records if r.source == "anchor"]
    assert sum(r["wm/update_examples"] for r in rows) == len(anchors)
    code_anchors = [r for r in anchors if code_diff(r)]
    assert code_anchors, [r.solution_text for r in anchors]  # edits outside the knobs block, executed
    assert all(math.isfinite(r.reward) for r in code_anchors)
    assert any(r.reward > FAILURE_SCORE for r in code_anchors)  # and some of them ran and scored
    rejected = [r for r in records if r.source == "rejected"]
    assert all(r.status.startswith("rejected: ") and len(r.status) > 12 for r in rejected)


def test_sft_cuts_prompts_where_rollouts_do():
    """A free-mode prompt (the whole program) is longer than 512 tokens for a real LM: SFT and its
    validity samples cut it to ``domain.max_prompt_tokens`` as rollouts do, and that length keys
    the SFT cache (unchanged at the default 512)."""
    from wmrl_research.lm import build_tokenizer, tiny_lm
    from wmrl_research.pipeline import _policy_fields
    from wmrl_research.policy import ResearchPolicy, sequence_nll
    from wmrl_research.sft import SFTConfig, run_sft

    pairs = sft_examples([IRIS], 4, random.Random(3), mode="free")
    tok = build_tokenizer([p + c for p, c in pairs], vocab_size=300)
    policy = ResearchPolicy(tiny_lm(tok, hidden=32, layers=1), tok)
    cut = 24
    # the first step's loss is the batch's NLL before any update: rebuild that batch's pairs
    expected = {
        n: float(sequence_nll(policy, [p for p, _ in pairs], [c for _, c in pairs], n)) for n in (cut, 512)
    }
    cfg = SFTConfig(steps=1, batch_size=4, lr=0.0, seed=3, mode="free", max_prompt_tokens=cut)
    (loss,) = run_sft(policy, [IRIS], cfg)
    assert loss == pytest.approx(expected[cut], rel=1e-5) and expected[cut] != pytest.approx(expected[512])
    base = load_config("research-free-tiny", [])
    longer = load_config("research-free-tiny", ["--domain.max_prompt_tokens=1536"])
    train, _ = select_tasks(base.domain)
    assert "max_prompt_tokens" not in str(_policy_fields(base.domain, base, train))
    assert _policy_fields(longer.domain, longer, train) != _policy_fields(base.domain, base, train)
