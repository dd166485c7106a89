import random

import pytest
import torch
from research_fixtures import FakeTask

from wmrl.domain import RolloutBatch
from wmrl_research.edits import sample_knob_edit
from wmrl_research.lm import add_lora, build_tokenizer, load_lm, tiny_lm
from wmrl_research.policy import ResearchPolicy
from wmrl_research.prompts import build_prompt, encode_prompts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    t, rng = FakeTask(), random.Random(0)
    corpus = [t.description, t.baseline_source, build_prompt(t, t.baseline_source, "knobs")]
    corpus += [sample_knob_edit(t.baseline_source, t.knob_space, rng) for _ in range(40)]
    return build_tokenizer(corpus, vocab_size=400, path=tmp_path_factory.mktemp("tok"))


def prompts_batch(tok, n=4):
    t = FakeTask()
    prompts = [build_prompt(t, t.baseline_source, "knobs"), "Task: something much shorter\nEdit:\n"] * (
        n // 2
    )
    return encode_prompts(tok, prompts)


def test_tokenizer_round_trips_and_is_cached(tokenizer, tmp_path_factory):
    text = FakeTask().baseline_source
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    ids, mask = encode_prompts(tokenizer, ["a", "a much longer prompt"])
    assert mask[0].sum() < mask[1].sum() and mask[0, -1] == 1 and mask[0, 0] == 0  # left-padded
    assert ids[0, -2] == tokenizer.bos_token_id or ids[0, -3] == tokenizer.bos_token_id


def test_knobs_pretokenizer_fuses_a_knob_name_with_its_equals_sign():
    t, rng = FakeTask(), random.Random(0)
    corpus = [t.description, t.baseline_source, build_prompt(t, t.baseline_source, "knobs", "short")]
    corpus += [sample_knob_edit(t.baseline_source, t.knob_space, rng) for _ in range(40)]
    tok = build_tokenizer(corpus, vocab_size=400, pretokenizer="knobs")
    for text in (t.baseline_source, corpus[-1], 'UNSEEN_NAME = "x"  # a | b\n\n  x'):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    pieces = tok.convert_ids_to_tokens(tok('MODEL = "ridge"', add_special_tokens=False)["input_ids"])
    assert pieces[0] == "MODEL\u0120=" and len(pieces) == 2  # "MODEL =" then ' "ridge"'
    with pytest.raises(ValueError, match="pretokenizer"):
        build_tokenizer(corpus, vocab_size=400, pretokenizer="words")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_log_probs_equal_direct_computation(tokenizer, temperature):
    torch.manual_seed(0)
    pol = ResearchPolicy(tiny_lm(tokenizer, hidden=64), tokenizer, temperature=temperature, max_new_tokens=12)
    p_ids, p_mask = prompts_batch(tokenizer)
    s = pol.sample(p_ids, p_mask, torch.Generator().manual_seed(1))
    batch = RolloutBatch(
        tokens=s.tokens,
        logprobs=s.logprobs,
        mask=s.mask,
        group_ids=torch.arange(4),
        tasks=[None] * 4,
        extras={"prompt_ids": p_ids, "prompt_mask": p_mask},
    )
    lp = pol.log_probs(batch)
    assert lp.requires_grad and lp.shape == s.tokens.shape
    torch.testing.assert_close(lp * s.mask, s.logprobs, atol=1e-4, rtol=1e-4)
    # Direct: one unpadded sequence at a time, no attention mask, no cache.
    for i in range(4):
        prompt = p_ids[i][p_mask[i].bool()]
        n = int(s.mask[i].sum())
        ids = torch.cat([prompt, s.tokens[i, :n]])[None]
        logits = pol.model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
        direct = torch.log_softmax(logits, -1).gather(-1, s.tokens[i, :n, None]).squeeze(-1)
        torch.testing.assert_close(lp[i, :n], direct, atol=1e-4, rtol=1e-4)
        # after EOS: padding with mask 0
        assert (s.tokens[i, n:] == tokenizer.pad_token_id).all() and (s.mask[i, n:] == 0).all()
        if n < s.tokens.shape[1]:
            assert s.tokens[i, n - 1] == tokenizer.eos_token_id


def test_sampling_is_reproducible_from_the_generator(tokenizer):
    pol = ResearchPolicy(tiny_lm(tokenizer, hidden=64, seed=3), tokenizer, max_new_tokens=10)
    p_ids, p_mask = prompts_batch(tokenizer)
    a = pol.sample(p_ids, p_mask, torch.Generator().manual_seed(5)).tokens
    b = pol.sample(p_ids, p_mask, torch.Generator().manual_seed(5)).tokens
    c = pol.sample(p_ids, p_mask, torch.Generator().manual_seed(6)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)
    g1 = pol.sample(p_ids, p_mask, greedy=True).tokens
    g2 = pol.sample(p_ids, p_mask, greedy=True).tokens
    assert torch.equal(g1, g2)


def test_lora_step_changes_adapters_only(tokenizer):
    torch.manual_seed(0)
    model = add_lora(tiny_lm(tokenizer, hidden=64), r=4, alpha=8)
    pol = ResearchPolicy(model, tokenizer, max_new_tokens=8)
    trainable = {n: p.detach().clone() for n, p in pol.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in pol.named_parameters() if not p.requires_grad}
    assert trainable and frozen and all("lora_" in n for n in trainable)
    p_ids, p_mask = prompts_batch(tokenizer)
    s = pol.sample(p_ids, p_mask, torch.Generator().manual_seed(0))
    opt = torch.optim.SGD([p for p in pol.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):  # LoRA B starts at zero, so A moves only from the second step
        loss = -(pol.completion_log_probs(p_ids, p_mask, s.tokens) * s.mask).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = dict(pol.named_parameters())
    assert all(not torch.equal(params[n], v) for n, v in trainable.items())
    assert all(torch.equal(params[n], v) for n, v in frozen.items())


def test_bad_inputs_raise_clear_errors(tokenizer):
    with pytest.raises(ValueError, match="temperature"):
        ResearchPolicy(tiny_lm(tokenizer, hidden=64), tokenizer, temperature=-1)
    with pytest.raises(ValueError, match="needs a locally built tokenizer"):
        load_lm("tiny")
    with pytest.raises(OSError, match="cannot load causal LM"):
        load_lm("/nonexistent/model/dir")
    with pytest.raises(ValueError, match="empty corpus"):
        build_tokenizer([])
