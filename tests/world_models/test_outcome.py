"""Outcome world models on a small execution log whose true scores are a known function of the knobs."""

import itertools
import random

import pytest
import torch

torch.set_num_threads(1)

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from world_models.outcome import (  # noqa: E402
    EncoderOutcomeModel,
    ExecutionLog,
    LMOutcomeModel,
    OutcomeExample,
    outcome_metrics,
)

MODELS = {"ridge": 0.0, "forest": 0.8, "knn": None}  # knn crashes
ALPHAS = {0.1: 0.2, 1.0: 0.0, 10.0: -0.4}


def score(model: str, alpha: float, scale: bool) -> float:
    if MODELS[model] is None:
        return -1.0
    return MODELS[model] + ALPHAS[alpha] + (0.0 if scale else -0.3)


def examples() -> list[OutcomeExample]:
    out = []
    for m, a, s in itertools.product(MODELS, ALPHAS, (True, False)):
        text = f'MODEL = "{m}"\nALPHA = {a}\nSCALE = {s}\n'
        out.append(OutcomeExample("toy", "toy-regression rmse", text, score(m, a, s), "ok", "log"))
    random.Random(0).shuffle(out)
    return out


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [LMOutcomeModel.prompt(e.task_text, e.solution_text) for e in examples()]
    corpus += [" runs: yes; valid: no; quality: 0123456789"] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def test_execution_log_round_trips_and_reports_bad_lines(tmp_path):
    log = ExecutionLog(tmp_path / "log.jsonl")
    ex = examples()
    log.append(ex[:5])
    log.append(ex[5:7])
    assert log.load() == ex[:7] and len(log) == 7
    with open(log.path, "a") as f:
        f.write('{"nope": 1}\n')
    with pytest.raises(ValueError, match="log.jsonl:8"):
        log.load()


def test_outcome_metrics_match_direct_computation():
    mean = torch.tensor([0.0, 1.0, 2.0, 3.0])
    true = torch.tensor([0.0, 2.0, 1.0, 3.0])
    var = torch.tensor([1.0, 0.25, 4.0, 1.0])
    m = outcome_metrics(mean, var, true)
    assert m["mae"] == pytest.approx(0.5) and m["rmse"] == pytest.approx(0.5**0.5)
    assert m["spearman"] == pytest.approx(0.8)  # ranks 1,2,3,4 vs 1,3,2,4
    assert m["cover_1s"] == pytest.approx(0.75) and m["cover_2s"] == pytest.approx(1.0)
    assert m["z2"] == pytest.approx((0 + 4 + 0.25 + 0) / 4)
    with pytest.raises(ValueError, match="matching"):
        outcome_metrics(mean, None, true[:3])


def test_encoder_ensemble_learns_ranks_and_refines_online(tokenizer):
    ex = examples()
    train, test = ex[:12], ex[12:]
    wm = EncoderOutcomeModel(tokenizer, members=3, dim=32, batch_size=12, lr=3e-3, seed=0)
    y_test = torch.tensor([e.reward for e in test])
    before = outcome_metrics(
        *wm.predict([e.task_text for e in test], [e.solution_text for e in test]), y_test
    )
    stats = wm.fit(train, steps=120)
    assert stats["wm/fit_loss"] < 0.1 * stats["wm/fit_loss_first"]
    mean, var = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
    after = outcome_metrics(mean, var, y_test)
    assert after["spearman"] > 0.7 and after["mae"] < before["mae"]
    assert mean.shape == var.shape == (6,) and (var >= wm.var_floor).all() and var.max() > wm.var_floor
    # variance recalibration: mean predicted variance matches the mean squared error on the holdout
    scale = wm.calibrate_variance(test)
    m2, v2 = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
    torch.testing.assert_close(m2, mean)
    excess = ((m2 - y_test).pow(2) - wm.var_floor).clamp(min=0).mean()
    assert scale > 0 and float((v2 - wm.var_floor).mean()) == pytest.approx(float(excess), rel=1e-3, abs=1e-6)
    # online refinement on the held-out executions reduces their error
    wm.update(test, steps=40)
    refined = outcome_metrics(
        *wm.predict([e.task_text for e in test], [e.solution_text for e in test]), y_test
    )
    assert refined["mae"] < after["mae"] and len(wm.examples) == 18
    # state round trip gives identical predictions
    clone = EncoderOutcomeModel(tokenizer, members=3, dim=32, batch_size=12, seed=1)
    clone.load_state_dict_full(wm.state_dict_full())
    torch.testing.assert_close(clone.predict(["toy"], ["MODEL"])[0], wm.predict(["toy"], ["MODEL"])[0])


def test_lm_world_model_structured_answers_and_scores(tokenizer):
    torch.manual_seed(0)
    from wmrl_research.policy import ResearchPolicy

    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    lm = ResearchPolicy(Qwen3ForCausalLM(cfg), tokenizer)
    wm = LMOutcomeModel(lm, samples=4, lo=-0.5, hi=1.5, batch_size=12, lr=1e-2)
    assert wm.answer(-1.0) == " runs: no; valid: no; quality: 0"
    assert wm.answer(1.5) == " runs: yes; valid: yes; quality: 9"
    assert wm.score(" runs: yes; valid: yes; quality: 9") == pytest.approx(1.5)
    assert wm.score(" runs: yes; valid: no; quality: 5") == -1.0 and wm.score("garbage") is None
    ex = examples()
    train, test = ex[:12], ex[12:]
    wm.fit(train, steps=100)
    mean, var = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
    m = outcome_metrics(mean, var, torch.tensor([e.reward for e in test]))
    assert m["spearman"] > 0.5 and (var > 0).all()
