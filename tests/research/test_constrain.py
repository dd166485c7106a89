"""Constrained decoding of SEARCH texts (wmrl_research/constrain.py) and its use by the policy."""

import random
import re
from types import SimpleNamespace

import pytest
import torch
from research_fixtures import SOURCE, FakeTask
from torch import nn

from wmrl.domain import RolloutBatch
from wmrl_research.constrain import (
    EXTRA_ALLOWED,
    EXTRA_CONSTRAINED,
    HEAD,
    SearchConstraint,
    TokenIndex,
    block_targets,
    knob_value_sources,
    masked_token_log_probs,
    pad_allowed,
    search_lines,
    targets_for,
    token_bytes,
)
from wmrl_research.edits import apply_edits, knobs_block, parse_knobs, sample_knob_edit
from wmrl_research.lm import build_tokenizer, tiny_lm
from wmrl_research.policy import ResearchPolicy
from wmrl_research.prompts import build_prompt, encode_prompts
from wmrl_research.tasks import list_tasks

HELDOUT = list_tasks("heldout", tier="light")


@pytest.fixture(scope="module", params=["bytelevel", "knobs"])
def tokenizer(request, tmp_path_factory):
    """A tokenizer trained on the fake task only: held-out knob lines are unseen text to it."""
    t, rng = FakeTask(), random.Random(0)
    corpus = [t.description, t.baseline_source, build_prompt(t, t.baseline_source, "knobs", "short")]
    corpus += [sample_knob_edit(t.baseline_source, t.knob_space, rng) for _ in range(60)]
    return build_tokenizer(corpus, vocab_size=400, pretokenizer=request.param)


def brute_force_allowed(partial: bytes, targets, pieces) -> set[int]:
    """The rule, by scanning the whole vocabulary."""
    out = set()
    for i, s in enumerate(pieces):
        if not s:
            continue
        u = partial + s
        if any(t.startswith(u) or u.startswith(t) for t in targets):
            out.add(i)
    return out


def test_search_lines_are_the_compact_and_whole_knob_lines():
    assert search_lines(SOURCE) == ['MODEL = "ridge"', "ALPHA = 1.0", "SCALE = True"]
    src = SOURCE.replace("ALPHA = 1.0\n", "ALPHA = 1.0  # penalty\n")
    assert "ALPHA = 1.0  # penalty" in search_lines(src) and "ALPHA = 1.0" in search_lines(src)
    # a text that occurs twice in the source is not a valid SEARCH text
    dup = SOURCE.replace("MODEL_NAMES", 'MODEL = "ridge"\nMODEL_NAMES')
    assert 'MODEL = "ridge"' not in search_lines(dup)
    assert search_lines("no knobs here") == []
    for t in HELDOUT:
        for line in search_lines(t.baseline_source):
            edit = f"<<<<<<< SEARCH\n{line}\n=======\n{line}\n>>>>>>> REPLACE"
            assert apply_edits(t.baseline_source, edit, "knobs").ok


def test_next_block_targets_follow_the_edited_source():
    first = "<<<<<<< SEARCH\nALPHA = 1.0\n=======\nALPHA = 10.0\n>>>>>>> REPLACE\n"
    targets = block_targets(SOURCE, first)
    assert b"\nALPHA = 10.0\n=======\n" in targets and b"\nALPHA = 1.0\n=======\n" not in targets
    assert block_targets(SOURCE, "garbage <<<<<<< SEARCH\nNOPE\n") == targets_for(search_lines(SOURCE))


def test_token_bytes_round_trip(tokenizer):
    pieces = token_bytes(tokenizer)
    assert pieces[tokenizer.eos_token_id] is None and pieces[tokenizer.pad_token_id] is None
    text = HELDOUT[0].baseline_source
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert b"".join(pieces[i] for i in ids).decode() == text


def test_fast_mask_agrees_with_brute_force_on_random_prefixes(tokenizer):
    pieces = token_bytes(tokenizer)
    index = TokenIndex(pieces)
    rng = random.Random(0)
    checked = 0
    for t, replace in [(t, r) for t in [*HELDOUT, FakeTask()] for r in (False, True)]:
        targets = targets_for(search_lines(t.baseline_source), replace)
        for _ in range(40):
            target = rng.choice(targets)
            partial = target[: rng.randrange(len(target))]  # a body state: a proper prefix
            fast = index.allowed(partial, targets)
            assert set(fast) == brute_force_allowed(partial, targets, pieces)
            assert fast and tokenizer.eos_token_id not in fast
            checked += 1
    # a partial that no target extends allows nothing
    assert index.allowed(b"\nNOT_A_KNOB", targets_for(search_lines(SOURCE))) == ()
    assert checked == 400


def test_masked_log_probs_match_a_dense_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    allowed_steps = [[(1, 4, 7), None, (2,)], [None, None, None], [(0, 10), (3, 5), None],
                     [(6,), None, None], [None, (1, 2, 3, 4), None]]  # fmt: skip
    allowed, flag = pad_allowed(allowed_steps, 3)
    assert allowed.shape == (3, 5, 4) and flag.sum() == 6
    tokens = torch.zeros(3, 5, dtype=torch.long)
    for t, step in enumerate(allowed_steps):
        for r, a in enumerate(step):
            tokens[r, t] = a[-1] if a else (r + t) % 11
    lp = masked_token_log_probs(logits, tokens, allowed, flag)
    for r in range(3):
        for t in range(5):
            z = logits[r, t].clone()
            a = allowed_steps[t][r]
            if a:
                keep = torch.zeros(11, dtype=torch.bool)
                keep[list(a)] = True
                z[~keep] = float("-inf")
            want = torch.log_softmax(z, -1)[tokens[r, t]]
            torch.testing.assert_close(lp[r, t], want)
    with pytest.raises(ValueError, match="do not match"):
        masked_token_log_probs(logits, tokens, allowed[:, :2], flag)


class Memoriser(nn.Module):
    """An untrained tiny LM plus a trigram bias that makes it write ``script``: a memorised edit
    with a wrong current value, the failure mode of the SFT policy on held-out tasks."""

    def __init__(self, model: nn.Module, tokenizer, prompt_end: list[int], script: str, strength: float):
        super().__init__()
        self.model = model
        ids = prompt_end + tokenizer(script, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.table: dict[tuple[int, int], list[int]] = {}
        for a, b, c in zip(ids, ids[1:], ids[2:], strict=False):
            self.table.setdefault((a, b), []).append(c)
        self.strength = strength
        self.seen: torch.Tensor | None = None

    def forward(self, input_ids, past_key_values=None, logits_to_keep=0, **kw):
        out = self.model(
            input_ids=input_ids, past_key_values=past_key_values, logits_to_keep=logits_to_keep, **kw
        )
        self.seen = (
            input_ids
            if past_key_values is None or self.seen is None
            else torch.cat([self.seen, input_ids], 1)
        )
        logits = out.logits.clone()
        k = logits.shape[1]
        for r in range(logits.shape[0]):
            for j in range(k):
                p = self.seen.shape[1] - k + j  # the position whose next token these logits predict
                if p >= 1:
                    for c in self.table.get((int(self.seen[r, p - 1]), int(self.seen[r, p])), ()):
                        logits[r, j, c] += self.strength
        return SimpleNamespace(logits=logits, past_key_values=out.past_key_values)


def memoriser_policy(
    tokenizer, task, strength=12.0, temperature=1.0, constraint=True, replace=False, values=False
):
    prompt = build_prompt(task, task.baseline_source, "knobs", "short")
    p_ids, p_mask = encode_prompts(tokenizer, [prompt])
    # a known knob name with a wrong current value: the exact match fails without the constraint
    name = next(iter(task.knob_space))
    script = f"<<<<<<< SEARCH\n{name} = 12345\n=======\n{name} = 7\n>>>>>>> REPLACE"
    model = Memoriser(
        tiny_lm(tokenizer, hidden=32, seed=1), tokenizer, p_ids[0, -2:].tolist(), script, strength
    )
    pol = ResearchPolicy(
        model,
        tokenizer,
        temperature=temperature,
        max_new_tokens=96,
        search_constraint=constraint,
        constrain_replace=replace,
        constrain_values=values,
    )
    return pol, prompt


@pytest.mark.parametrize("task", HELDOUT, ids=[t.id for t in HELDOUT])
def test_constrained_search_texts_are_knob_lines_of_a_heldout_task(tokenizer, task):
    n = 8
    pol, prompt = memoriser_policy(tokenizer, task)
    ids, mask = encode_prompts(tokenizer, [prompt] * n)
    lines = set(search_lines(task.baseline_source))
    gen = torch.Generator().manual_seed(0)
    s = pol.sample(ids, mask, gen, sources=[task.baseline_source] * n)
    closed = 0
    for text in s.texts:
        assert text.startswith("<<<<<<< SEARCH\n")
        # every SEARCH body written (the text between the header and the divider) is a knob line
        for body in re.findall(r"<<<<<<< SEARCH\n(.*?)\n=======\n", text, re.DOTALL):
            assert body in lines, (body, text)
            block = f"<<<<<<< SEARCH\n{body}\n=======\n{body}\n>>>>>>> REPLACE"
            assert apply_edits(task.baseline_source, block, "knobs").ok
            closed += 1
    assert closed >= n - 1, s.texts  # the constraint, not the model, makes the SEARCH texts match
    # the same model without the constraint writes the memorised wrong line: nothing applies
    off = pol.sample(ids, mask, torch.Generator().manual_seed(0))
    assert sum(apply_edits(task.baseline_source, t, "knobs").ok for t in off.texts) == 0
    assert off.allowed is None and off.constrained is None


def test_sampler_and_recomputed_log_probs_agree_under_the_constraint(tokenizer):
    task, n = HELDOUT[2], 6
    pol, prompt = memoriser_policy(tokenizer, task, strength=6.0, temperature=0.7)
    ids, mask = encode_prompts(tokenizer, [prompt] * n)
    s = pol.sample(ids, mask, torch.Generator().manual_seed(3), sources=[task.baseline_source] * n)
    assert s.constrained is not None and s.constrained.sum() > 10
    assert s.allowed.shape[:2] == s.tokens.shape and (s.mask[s.constrained] == 1).all()
    # the sampled token is among the allowed ids wherever the row was constrained
    hit = (s.allowed == s.tokens[..., None]).any(-1)
    assert hit[s.constrained].all()
    batch = RolloutBatch(
        tokens=s.tokens,
        logprobs=s.logprobs,
        mask=s.mask,
        group_ids=torch.arange(n),
        tasks=[task] * n,
        extras={"prompt_ids": ids, "prompt_mask": mask, **s.extras()},
    )
    lp = pol.log_probs(batch)
    assert lp.requires_grad
    torch.testing.assert_close(lp * s.mask, s.logprobs, atol=1e-4, rtol=1e-4)  # ratio 1
    # unmasked log-probs differ at constrained positions (the constraint moved mass)
    plain = pol.completion_log_probs(ids, mask, s.tokens).detach()
    assert (plain[s.constrained] < s.logprobs[s.constrained] - 1e-3).any()
    # minibatch slices keep their masks
    rows = torch.tensor([4, 1])
    sub = batch.select(rows)
    assert sub.extras[EXTRA_ALLOWED].shape[0] == 2 and sub.extras[EXTRA_CONSTRAINED].shape[0] == 2
    torch.testing.assert_close(pol.log_probs(sub).detach() * sub.mask, s.logprobs[rows], atol=1e-4, rtol=1e-4)
    # gradients stay finite through the masked logsumexp
    (lp * s.mask).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in pol.parameters() if p.grad is not None)


def test_constraint_off_is_a_no_op(tokenizer):
    task, n = HELDOUT[0], 4
    pol, prompt = memoriser_policy(tokenizer, task, strength=4.0, constraint=False)
    ids, mask = encode_prompts(tokenizer, [prompt] * n)
    a = pol.sample(ids, mask, torch.Generator().manual_seed(2), sources=[task.baseline_source] * n)
    b = pol.sample(ids, mask, torch.Generator().manual_seed(2))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert a.extras() == {} and a.allowed is None
    # on, but no sources (SFT validity, the LM world model): unconstrained as well
    pol.search_constraint = True
    c = pol.sample(ids, mask, torch.Generator().manual_seed(2))
    assert torch.equal(c.tokens, b.tokens) and c.extras() == {}
    with pytest.raises(ValueError, match="sources"):
        pol.sample(ids, mask, sources=[task.baseline_source])


def test_constraint_state_closes_bodies_and_reopens_for_the_next_block(tokenizer):
    pieces = token_bytes(tokenizer)
    text = (
        "<<<<<<< SEARCH\nALPHA = 1.0\n=======\nALPHA = 10.0\n>>>>>>> REPLACE\n"
        "<<<<<<< SEARCH\nALPHA = 10.0\n=======\nALPHA = 0.1\n>>>>>>> REPLACE"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    c = SearchConstraint(TokenIndex(pieces), pieces, [SOURCE])
    n_constrained = 0
    for i in ids:
        (a,) = c.allowed()
        if a is not None:
            assert i in a  # the valid two-block edit is never masked out
            n_constrained += 1
        c.advance([i], [True])
    assert c.body == [None] and c.text[0].decode() == text and n_constrained >= 4
    # a body starts right after the header
    c2 = SearchConstraint(TokenIndex(pieces), pieces, [SOURCE])
    for i in tokenizer("x " + HEAD.decode(), add_special_tokens=False)["input_ids"]:
        c2.advance([i], [True])
    assert c2.body == [len(c2.text[0])] and c2.allowed()[0]


def test_replace_texts_start_with_the_chosen_knob_name(tokenizer):
    task, n = HELDOUT[1], 8
    pol, prompt = memoriser_policy(tokenizer, task, replace=True)
    ids, mask = encode_prompts(tokenizer, [prompt] * n)
    s = pol.sample(ids, mask, torch.Generator().manual_seed(0), sources=[task.baseline_source] * n)
    lines = set(search_lines(task.baseline_source))
    n_blocks = 0
    for text in s.texts:
        for search, replace in re.findall(r"<<<<<<< SEARCH\n(.*?)\n=======\n(.*)", text, re.DOTALL):
            assert search in lines
            name = search.split("=")[0].strip()
            assert replace.startswith(f"{name} =") or f"{name} =".startswith(replace), (search, replace)
            n_blocks += 1
    assert n_blocks >= n - 1
    # the valid two-block edit is never masked out with the REPLACE rule on either
    pieces = token_bytes(tokenizer)
    text = (
        "<<<<<<< SEARCH\nALPHA = 1.0\n=======\nALPHA = 10.0\n>>>>>>> REPLACE\n"
        "<<<<<<< SEARCH\nALPHA = 10.0\n=======\nALPHA = 0.1\n>>>>>>> REPLACE"
    )
    steps = {}
    for replace in (False, True):
        c = SearchConstraint(TokenIndex(pieces), pieces, [SOURCE], replace_name=replace)
        steps[replace] = 0
        for i in tokenizer(text, add_special_tokens=False)["input_ids"]:
            (a,) = c.allowed()
            assert a is None or i in a
            steps[replace] += a is not None
            c.advance([i], [True])
        assert c.body == [None]
    assert steps[True] >= steps[False] + 2  # the REPLACE's `ALPHA =` is constrained too


def test_the_flag_enters_the_decoding_cache_keys_but_not_the_sft_key():
    from wmrl.config import load_config
    from wmrl_research import pipeline

    off = load_config("research-tiny", ["--domain.search_constraint=false"])
    on = load_config(
        "research-tiny",
        ["--domain.search_constraint_replace=false", "--domain.search_constraint_values=false"],
    )
    rep = load_config("research-tiny", ["--domain.search_constraint_values=false"])
    val = load_config("research-tiny", [])
    free = load_config("research-tiny", ["--domain.edit_mode=free", "--domain.prompt_style=full"])
    assert rep.domain.search_constraint and rep.domain.search_constraint_replace  # the preset's default
    assert on.domain.search_constraint and pipeline.constrained(on.domain)
    assert not pipeline.constrained(free.domain)  # knobs mode only
    train, _ = pipeline.select_tasks(on.domain)
    assert pipeline._policy_fields(on.domain, on, train) == pipeline._policy_fields(off.domain, off, train)
    assert val.domain.search_constraint_values  # the preset's default since the knob surrogate
    keys = {pipeline._key(pipeline._decoding_key(c.domain)) for c in (off, on, rep, val)}
    assert len(keys) == 4 and pipeline._decoding_key(off.domain) == []  # old keys unchanged when off
    assert pipeline._decoding_key(rep.domain) == [["search_constraint", "replace"]]  # as before


def test_value_targets_are_whole_replace_texts_of_the_declared_space():
    values = knob_value_sources(FakeTask().knob_space)
    assert values["MODEL"] == ['"ridge"', '"forest"', '"knn"'] and values["SCALE"] == ["True", "False"]
    t = targets_for(["ALPHA = 1.0", "UNDECLARED = 3"], values=values)
    assert t == tuple(
        sorted(
            f"\nALPHA = 1.0\n=======\nALPHA = {v}\n>>>>>>> REPLACE".encode() for v in ("0.1", "1.0", "10.0")
        )
    )
    # a knob with no declared space has no target: not editable under the value rule
    assert not any(b"UNDECLARED" in x for x in t)


def test_value_rule_masks_values_outside_the_space(tokenizer):
    pieces = token_bytes(tokenizer)
    values = [knob_value_sources(FakeTask().knob_space)]
    valid = (
        "<<<<<<< SEARCH\nALPHA = 1.0\n=======\nALPHA = 10.0\n>>>>>>> REPLACE\n"
        "<<<<<<< SEARCH\nALPHA = 10.0\n=======\nALPHA = 0.1\n>>>>>>> REPLACE"
    )
    c = SearchConstraint(TokenIndex(pieces), pieces, [SOURCE], replace_name=True, values=values)
    n_constrained = 0
    for i in tokenizer(valid, add_special_tokens=False)["input_ids"]:
        (a,) = c.allowed()
        assert a is None or i in a  # the valid two-block edit is never masked out
        n_constrained += a is not None
        c.advance([i], [True])
    assert c.body == [None] and n_constrained >= 8
    # the same edit to a value outside the space (1.01; a string) is masked at some step
    for bad in ("ALPHA = 1.01", 'ALPHA = "lstm"', "MODEL = 7"):
        search = "ALPHA = 1.0" if bad.startswith("ALPHA") else 'MODEL = "ridge"'
        text = f"<<<<<<< SEARCH\n{search}\n=======\n{bad}\n>>>>>>> REPLACE"
        c = SearchConstraint(TokenIndex(pieces), pieces, [SOURCE], values=values)
        masked = False
        for i in tokenizer(text, add_special_tokens=False)["input_ids"]:
            (a,) = c.allowed()
            if a is not None and i not in a:
                masked = True
                break
            c.advance([i], [True])
        assert masked, bad
    # brute force: inside a REPLACE value, the allowed ids are exactly the rule's
    c = SearchConstraint(TokenIndex(pieces), pieces, [SOURCE], values=values)
    for i in tokenizer("<<<<<<< SEARCH\nALPHA = 1.0\n=======\nALPHA = 1", add_special_tokens=False)[
        "input_ids"
    ]:
        c.advance([i], [True])
    (a,) = c.allowed()
    assert set(a) == brute_force_allowed(c.text[0][c.body[0] :], c.targets[0], pieces)


@pytest.mark.parametrize("task", HELDOUT, ids=[t.id for t in HELDOUT])
def test_sampled_edits_set_values_of_the_declared_space(tokenizer, task):
    # the memorised edit writes `NAME = 7`, a value outside every held-out space
    n = 8
    pol, prompt = memoriser_policy(tokenizer, task, replace=True, values=True)
    ids, mask = encode_prompts(tokenizer, [prompt] * n)
    gen = torch.Generator().manual_seed(0)
    s = pol.sample(ids, mask, gen, sources=[task.baseline_source] * n, knob_spaces=[task.knob_space] * n)
    space = knob_value_sources(task.knob_space)
    applied = 0
    for text in s.texts:
        for replace in re.findall(r"=======\n(.*?)\n>>>>>>> REPLACE", text, re.DOTALL):
            name, _, value = replace.partition(" = ")
            assert value in space[name], (replace, text)
        res = apply_edits(task.baseline_source, text, "knobs")
        if res.ok:
            applied += 1
            knobs = parse_knobs(knobs_block(res.source))
            assert all(knobs[k] in space[k] for k in space), knobs
    assert applied >= n - 1, s.texts
    # without knob spaces the value rule has nothing to apply: REPLACE values stay free (`= 7`)
    free = pol.sample(ids, mask, torch.Generator().manual_seed(0), sources=[task.baseline_source] * n)
    assert any(" = 7" in t for t in free.texts)
