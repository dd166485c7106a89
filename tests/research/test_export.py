"""`wmrl export` of research runs: the exported agent, loaded with transformers alone (peft for the
adapter), gives the run's final policy's log-probs and greedy completions; the outcome WM predicts
the same scores after its own round trip."""

import json
from pathlib import Path

import pytest
import torch

from wmrl.config import load_config
from wmrl.export import export_run
from wmrl.trainer import Trainer
from wmrl_research.lm import build_tokenizer, tiny_lm
from wmrl_research.prompts import build_prompt, encode_prompts

# The research-debug preset, smaller still: the export needs a trained run, not a good one.
TINY = [
    "--domain.sft_steps=20",
    "--domain.log_samples_per_task=6",
    "--domain.eval_samples_per_task=1",
    "--domain.wm_pretrain_steps=10",
    "--grpo.steps=2",
    "--grpo.lr=1e-2",  # the final policy must differ visibly from the SFT one,
    "--grpo.weight_decay=0.1",  # even when a 20-step SFT policy's edits all fail (zero advantages)
    "--tracking.eval_every=2",
    "--domain.world_model=encoder",  # the surrogate (the presets' WM) has its own round trip below
    "--domain.log_random_per_task=0",
]


def _train(tmp, name, *extra):
    cfg = load_config(
        "research-debug",
        [f"--domain.cache_dir={tmp / 'cache'}", f"--out_dir={tmp / name}", *TINY, *extra],
    )
    domain = cfg.domain.build(cfg)
    last = Trainer(cfg, domain).train()
    return cfg, domain, last


def _prompts(domain):
    tasks = domain.train_tasks + domain.eval_tasks[:2]
    return [build_prompt(t, t.baseline_source, "knobs", "short") for t in tasks]


def _completion_log_probs(model, tokenizer, prompts, completions):
    """``[N, T]`` log-probs of the completions after the prompts, with nothing but the HF objects:
    a BOS first, prompts left-padded, positions counted over the real tokens."""
    p_ids, p_mask = encode_prompts(tokenizer, prompts)
    rows = [
        tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions
    ]
    width = max(len(r) for r in rows)
    c_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    ids = torch.cat([p_ids, c_ids], 1)
    attn = torch.cat([p_mask, torch.ones_like(c_ids)], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    lp = torch.log_softmax(logits[:, p_ids.shape[1] - 1 : -1].float(), -1)
    return lp.gather(-1, c_ids[..., None]).squeeze(-1), (p_ids, p_mask, c_ids)


def _greedy(model, tokenizer, prompt, n=24):
    ids, _ = encode_prompts(tokenizer, [prompt])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1] :]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("research-export")
    cfg, domain, last = _train(tmp, "run")
    out = tmp / "out"
    export_run(tmp / "run", out)
    return cfg, domain, last, out


def test_exported_agent_loads_with_transformers_and_scores_like_the_final_policy(tiny_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, domain, _, out = tiny_run
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    policy = domain.policy.eval()
    prompts = _prompts(domain)
    assert tok(prompts[0])["input_ids"] == policy.tokenizer(prompts[0])["input_ids"]
    completions = ["<<<<<<< SEARCH\nC = 1.0\n=======\nC = 0.1\n>>>>>>> REPLACE"] * len(prompts)
    got, (p_ids, p_mask, c_ids) = _completion_log_probs(model, tok, prompts, completions)
    with torch.no_grad():
        want = policy.completion_log_probs(p_ids, p_mask, c_ids, temperature=1.0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for p in prompts[:2]:  # greedy decoding with transformers' generate = the policy's greedy sampler
        ids, mask = encode_prompts(tok, [p])
        mine = policy.sample(ids, mask, greedy=True, max_new_tokens=24)
        n = int(mine.mask[0].sum())
        assert torch.equal(_greedy(model, tok, p)[:n], mine.tokens[0, :n])


def test_export_holds_the_final_policy_and_the_outcome_wm(tiny_run):
    from transformers import AutoModelForCausalLM

    from world_models.outcome import EncoderOutcomeModel

    cfg, domain, _, out = tiny_run
    exported = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    sft = torch.load(next(Path(cfg.domain.cache_dir).glob("*/policy.pt")), weights_only=True)
    changed = [
        k for k, v in exported.items() if f"model.{k}" in sft and not torch.equal(v, sft[f"model.{k}"])
    ]
    assert changed  # RL moved the weights; the export holds the final ones
    wm = EncoderOutcomeModel.from_pretrained(out / "world_model")
    examples = domain.world_model.log.load()[:12]
    a = wm.predict([e.task_text for e in examples], [e.solution_text for e in examples])
    b = domain.world_model.model.predict([e.task_text for e in examples], [e.solution_text for e in examples])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    agent = json.loads((out / "wmrl_agent.json").read_text())
    assert agent["search_constraint"] and agent["example_prompt"].startswith("Task:")


def test_export_rebuilds_the_same_tokenizer_when_the_cache_is_gone(tiny_run, tmp_path):
    from wmrl_research.pipeline import select_tasks, untrained_policy

    cfg, domain, _, _ = tiny_run
    train, heldout = select_tasks(cfg.domain)
    rebuilt = untrained_policy(cfg.domain, cfg, train, heldout, tmp_path).tokenizer
    assert rebuilt.get_vocab() == domain.policy.tokenizer.get_vocab()
    text = _prompts(domain)[-1]
    assert rebuilt(text)["input_ids"] == domain.policy.tokenizer(text)["input_ids"]


def test_lora_run_exports_merged_weights_or_the_adapter(tmp_path):
    """A LoRA run over a local pretrained checkpoint: merged export = transformers alone; --adapter
    export = peft over the same base. Both give the final policy's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "base"
    corpus = ["Task: iris_cls (tabular-classification), accuracy", "C = 1.0", "<<<<<<< SEARCH", "=======",
              ">>>>>>> REPLACE", "MODEL = 'logreg'"] * 4  # fmt: skip
    tok = build_tokenizer(corpus, 300, base)
    tiny_lm(tok, hidden=32, layers=1, heads=2).save_pretrained(str(base))
    _, domain, _ = _train(tmp_path, "run", f"--domain.policy={base}", "--domain.lora=true",
                          "--domain.lora_rank=4", "--domain.sft_steps=5", "--grpo.lr=5e-2")  # fmt: skip
    # a pretrained checkpoint trains with gradient checkpointing (domain.gradient_checkpointing's default)
    assert domain.policy.model.get_base_model().is_gradient_checkpointing
    policy = domain.policy.eval()
    prompts = _prompts(domain)
    ids, mask = encode_prompts(policy.tokenizer, prompts)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = policy.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        base_logits = AutoModelForCausalLM.from_pretrained(str(base))(
            input_ids=ids, attention_mask=mask, position_ids=pos
        ).logits
    assert not torch.allclose(want, base_logits, atol=1e-4)  # the adapters learned something

    export_run(tmp_path / "run", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert not any("lora" in k for k in merged.state_dict())
    export_run(tmp_path / "run", tmp_path / "adapter", adapter=True)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base)), str(tmp_path / "adapter")
    )
    assert (
        AutoTokenizer.from_pretrained(str(tmp_path / "adapter")).get_vocab() == policy.tokenizer.get_vocab()
    )
    with torch.no_grad():
        for m in (merged, adapted.eval()):
            got = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_research_models_and_update_batches_are_on_the_configured_device(tiny_run, tmp_path, monkeypatch):
    """--device in the research domain: policy (SFT ran there), KL reference, outcome WM and every
    learner batch on the configured device; the WM's predictions come back on the CPU."""
    import wmrl.trainer as trainer_mod
    from wmrl.device import resolve_device

    cfg, domain, _, _ = tiny_run
    cfg = load_config(
        "research-debug",
        [f"--domain.cache_dir={cfg.domain.cache_dir}", f"--out_dir={tmp_path / 'run'}", *TINY,
         "--device=auto", "--grpo.steps=1", "--grpo.kl_coef=0.1"],
    )  # fmt: skip
    want = resolve_device(cfg.device)
    seen, real = [], trainer_mod.grpo_update

    def recording(policy, optimizer, batch, adv, used, *args, **kwargs):  # the real update still runs
        seen.append({t.device for t in [batch.tokens, batch.mask, adv, used, *batch.extras.values()]})
        return real(policy, optimizer, batch, adv, used, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "grpo_update", recording)
    trainer = Trainer(cfg, domain)
    trainer.train()
    assert seen and all(s == {want} for s in seen)
    for m in (domain.policy, trainer.reference, domain.world_model.model):
        assert {p.device for p in m.parameters()} == {want}
    ex = domain.world_model.log.load()[:4]
    mean, var = domain.world_model.model.predict([e.task_text for e in ex], [e.solution_text for e in ex])
    assert mean.device.type == var.device.type == "cpu"


def test_knob_surrogate_world_model_round_trips_as_plain_data(tiny_run, tmp_path):
    """The presets' WM: exported as JSON (no pickle), refitted by ``from_export`` to the same predictions."""
    from world_models.knob_surrogate import KnobSurrogateOutcomeModel

    cfg, _, _, _ = tiny_run
    run_cfg, domain, _ = _train(tmp_path, "sur", "--domain.world_model=surrogate", "--grpo.steps=1",
                                f"--domain.cache_dir={cfg.domain.cache_dir}")  # fmt: skip
    out = tmp_path / "out"
    export_run(tmp_path / "sur", out)
    wm = KnobSurrogateOutcomeModel.from_export(out / "world_model" / "knob_surrogate.json")
    examples = domain.world_model.log.load()[:12]
    args = [e.task_text for e in examples], [e.solution_text for e in examples]
    a, b = wm.predict(*args), domain.world_model.model.predict(*args)
    assert len(wm.examples) == len(domain.world_model.model.examples) > 0
    assert all(torch.allclose(x, y) for x, y in zip(a, b, strict=True))
    assert json.loads((out / "wmrl_export.json").read_text())["world_model"]["class"].endswith(
        "KnobSurrogateOutcomeModel"
    )


def test_the_exported_agent_gives_edits_that_apply_in_one_call(tiny_run):
    """`propose_edits(DIR, task)`: prompted and decoded as the run did, every edit applies (plain
    `generate` leaves a small agent's SEARCH texts and values free, and they seldom do)."""
    from wmrl_research.agent import AGENT_FILE, load_agent, propose_edits
    from wmrl_research.edits import apply_edits, parse_edits

    _, domain, _, out = tiny_run
    agent = json.loads((out / AGENT_FILE).read_text())
    assert "propose_edits(DIR, TASK_ID" in agent["propose_edits"]
    loaded = load_agent(out)
    for task in (domain.train_tasks[0], domain.eval_tasks[0]):
        edits = propose_edits(loaded, task, n=8, seed=1)
        assert len(edits) == 8
        for text in edits:
            result = apply_edits(task.baseline_source, text, "knobs")
            assert result.ok and len(parse_edits(text)) == 1, (text, result.reason)
    assert propose_edits(out, domain.train_tasks[0].id, n=1, temperature=0)  # by path and task id
