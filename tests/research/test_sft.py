import random

import torch
from research_fixtures import FakeTask

from wmrl_research.edits import apply_edits
from wmrl_research.lm import build_tokenizer, tiny_lm
from wmrl_research.policy import ResearchPolicy, sequence_nll
from wmrl_research.prompts import build_prompt
from wmrl_research.sft import SFTConfig, SummedNLL, edit_validity, run_sft, sft_examples, share_nll


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


def test_data_parallel_shares_of_the_sft_loss_sum_to_the_whole_batch_gradient():
    """Each rank's share of an SFT batch (rows of different prompt and completion lengths, and a rank
    with none) over the whole batch's token count: the shares' losses and gradients sum to the
    1-process loss and gradient, so DDP's mean of ``share * N`` is the 1-process step."""
    torch.manual_seed(0)
    tasks = [FakeTask(), FakeTask(id="b", knob_space={"MODEL": ["ridge", "svm"], "ALPHA": [1.0, 2.0]})]
    corpus = [build_prompt(t, t.baseline_source, "knobs") for t in tasks]
    corpus += [c for _, c in sft_examples(tasks, 40, random.Random(1))]
    tok = build_tokenizer(corpus, vocab_size=400)
    pol = ResearchPolicy(tiny_lm(tok, hidden=32, layers=1, heads=2), tok, max_new_tokens=8)
    pairs = sft_examples(tasks, 5, random.Random(2))
    assert len({len(tok(c)["input_ids"]) for _, c in pairs}) > 1
    params = [p for p in pol.parameters() if p.requires_grad]
    whole = sequence_nll(pol, [p for p, _ in pairs], [c for _, c in pairs])
    g_whole = torch.autograd.grad(whole, params)
    model = SummedNLL(pol)
    for world in (2, 3, 6):  # 6 > 5 rows: one rank runs a row times 0
        total, grads = 0.0, [torch.zeros_like(p) for p in params]
        for rank in range(world):
            part = share_nll(model, pol, pairs, rank, world)
            total += float(part.detach())
            grads = [a + b for a, b in zip(grads, torch.autograd.grad(part, params), strict=True)]
        assert abs(total - float(whole)) < 1e-5
        for a, b in zip(grads, g_whole, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
