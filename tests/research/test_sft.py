import random

import torch
from research_fixtures import FakeTask

from wmrl_research.agent import ResearchPolicy, build_prompt, build_tokenizer, tiny_lm
from wmrl_research.edits import apply_edits
from wmrl_research.sft import SFTConfig, edit_validity, run_sft, sft_examples


def test_sft_examples_are_valid_edits_of_their_task():
    tasks = [FakeTask(), FakeTask(id="b", knob_space={"MODEL": ["ridge", "svm"], "ALPHA": [1.0, 2.0]})]
    by_prompt = {build_prompt(t, t.baseline_source, "knobs"): t for t in tasks}
    pairs = sft_examples(tasks, 40, random.Random(0))
    assert {by_prompt[p].id for p, _ in pairs} == {t.id for t in tasks}
    for p, c in pairs:
        res = apply_edits(by_prompt[p].baseline_source, c, "knobs")
        assert res.ok and res.source != by_prompt[p].baseline_source


def test_sft_makes_sampled_edits_apply():
    torch.manual_seed(0)
    tasks = [FakeTask()]
    corpus = [build_prompt(tasks[0], tasks[0].baseline_source, "knobs")]
    corpus += [c for _, c in sft_examples(tasks, 100, random.Random(1))]
    tok = build_tokenizer(corpus, vocab_size=600)
    pol = ResearchPolicy(tiny_lm(tok, hidden=96), tok, max_new_tokens=40)
    before = edit_validity(pol, tasks, 8, torch.Generator().manual_seed(0))
    losses = run_sft(pol, tasks, SFTConfig(steps=120, batch_size=8, lr=1e-2))
    after = edit_validity(pol, tasks, 16, torch.Generator().manual_seed(0))
    assert sum(losses[-5:]) < 0.2 * sum(losses[:5])
    assert before["apply_fraction"] == 0.0
    assert after["apply_fraction"] >= 0.75 and after["change_fraction"] >= 0.75
