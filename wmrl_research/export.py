"""Export a research run (``wmrl export``; the core's hook is :meth:`wmrl_research.plugin.ResearchPlugin.export`).

The agent is rebuilt as the pipeline builds it before SFT (:func:`wmrl_research.pipeline.untrained_policy`:
the tokenizer from the run's cache, the model from its config or base checkpoint, LoRA adapters)
and filled strictly from the run's last checkpoint. Written:

- ``DIR``: a transformers folder (``config.json``, ``model.safetensors``, ``generation_config.json``,
  the tokenizer) that ``AutoModelForCausalLM.from_pretrained(DIR)`` loads; a LoRA run's adapters
  are merged into the base weights (``merge_and_unload``). With ``adapter=True`` (LoRA runs only):
  the peft adapter instead (``adapter_config.json`` + ``adapter_model.safetensors``, its base named
  in ``base_model_name_or_path``), which ``PeftModel.from_pretrained(base, DIR)`` and transformers'
  own ``AutoModelForCausalLM.from_pretrained(DIR)`` (with peft installed) load.
- ``DIR/wmrl_agent.json``: how the run prompted and sampled (edit mode, prompt style, temperature,
  token limits, the search constraint) and an example prompt.
- ``DIR/world_model``: the outcome WM, the encoder ensemble as ``model.safetensors`` + ``config.json``
  + tokenizer (``EncoderOutcomeModel.from_pretrained``), or the LM WM as a transformers folder.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wmrl_research.wm_kinds import wm_kind

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl_research.config import ResearchConfig


def export_research(
    cfg: ResearchConfig, run: RunConfig, state: dict, out: Path, adapter: bool = False
) -> dict[str, Any]:
    from wmrl_research.pipeline import build_world_model, policy_cache, select_tasks, untrained_policy

    if adapter and not cfg.lora:
        raise ValueError("--adapter exports LoRA adapters; this run trained every weight (domain.lora=false)")
    train, heldout = select_tasks(cfg)
    cache = policy_cache(cfg, run)
    kind = wm_kind(cfg)
    with tempfile.TemporaryDirectory(prefix="wmrl-export-") as tmp:
        # The tokenizer the run trained with is in its cache; rebuilt (deterministically) if gone.
        where = (
            cache if (cache / "tokenizer" / "tokenizer.json").exists() or cfg.policy != "tiny" else Path(tmp)
        )
        policy = untrained_policy(cfg, run, train, heldout, where)
        policy.load_state_dict(state["policy"], strict=True)
        wm = build_world_model(cfg, run, policy.tokenizer)
    wm_state = state["domain"]["world_model"]
    kind.load_checkpoint(wm, wm_state)
    policy.eval()
    policy_info = _save_agent(cfg, policy, out, adapter)
    agent = _agent_card(cfg, policy.tokenizer, train, heldout)
    (out / "wmrl_agent.json").write_text(json.dumps(agent, indent=2))
    policy_info["files"] = [*policy_info["files"], "wmrl_agent.json"]

    wm_dir = out / "world_model"
    wm_info = kind.export(wm, wm_state, run, train + heldout, wm_dir)
    wm_info["files"] = sorted(p.relative_to(out).as_posix() for p in wm_dir.rglob("*") if p.is_file())
    return {
        "policy": policy_info,
        "world_model": wm_info,
        "tags": ["text-generation", "autoresearch", *(["lora"] if cfg.lora else [])],
        "notes": [_prompting_note(cfg, agent)],
    }


def _save_agent(cfg: ResearchConfig, policy, out: Path, adapter: bool) -> dict[str, Any]:
    """The agent's model and tokenizer in ``out``: a transformers folder (LoRA merged), or with
    ``adapter`` the peft adapter alone; its ``export.json`` entry."""
    tok = policy.tokenizer
    base = None
    if cfg.lora and adapter:
        policy.model.save_pretrained(str(out))
        base = policy.model.peft_config["default"].base_model_name_or_path
        files = ["adapter_config.json", "adapter_model.safetensors"]
        load = (
            "from peft import PeftModel\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"base = AutoModelForCausalLM.from_pretrained({base!r})\n"
            "model = PeftModel.from_pretrained(base, DIR)   # or AutoModelForCausalLM.from_pretrained(DIR)\n"
            "tokenizer = AutoTokenizer.from_pretrained(DIR)"
        )
        fmt = "peft LoRA adapter (safetensors)"
    else:
        model = policy.model.merge_and_unload() if cfg.lora else policy.model
        model.save_pretrained(str(out))
        files = sorted(p.name for p in out.iterdir() if p.is_file())
        load = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "model = AutoModelForCausalLM.from_pretrained(DIR)\n"
            "tokenizer = AutoTokenizer.from_pretrained(DIR)"
        )
        fmt = "transformers causal LM (safetensors)" + (", LoRA merged" if cfg.lora else "")
    tok.save_pretrained(str(out))
    files = sorted(
        set(files) | {p.name for p in out.iterdir() if p.is_file() and p.name.startswith(("tok", "special"))}
    )
    return {
        "type": cfg.policy,
        "format": fmt,
        "library": "peft" if (cfg.lora and adapter) else "transformers",
        "base_model": base if base and not str(base).startswith(("/", ".")) else None,
        "files": files,
        "load": load,
    }


def _agent_card(cfg: ResearchConfig, tok, train: list[Any], heldout: list[Any]) -> dict[str, Any]:
    """``wmrl_agent.json``: how the run prompted and sampled, and an example prompt."""
    from wmrl_research.prompts import build_prompt

    example = build_prompt(heldout[0] if heldout else train[0], (heldout or train)[0].baseline_source,
                           cfg.edit_mode, cfg.prompt_style)  # fmt: skip
    agent = {
        "edit_mode": cfg.edit_mode,
        "prompt_style": cfg.prompt_style,
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "search_constraint": cfg.search_constraint and cfg.edit_mode == "knobs",
        "search_constraint_replace": cfg.search_constraint_replace,
        "search_constraint_values": cfg.search_constraint_values,
        "propose_edits": "from wmrl_research.agent import propose_edits; "
        "propose_edits(DIR, TASK_ID, n=8)  # edits that apply, decoded under the run's constraint",
        "bos_first": tok.bos_token_id is not None,
        "example_prompt": example,
        "train_tasks": [t.id for t in train],
        "heldout_tasks": [t.id for t in heldout],
    }
    return agent


def _prompting_note(cfg: ResearchConfig, agent: dict[str, Any]) -> str:
    """The folder README's note on prompting and decoding the agent as the run did."""
    return (
        "Prompts: `wmrl_agent.json` holds the run's prompt format and an example prompt "
        "(`wmrl_research.prompts.build_prompt`); the agent answers with SEARCH/REPLACE blocks. Sample at "
        f"temperature {cfg.temperature} with at most {cfg.max_new_tokens} new tokens, "
        + ("a BOS token first. " if agent["bos_first"] else "")
        + (
            "Training decoded SEARCH texts under the knob-line constraint "
            "(`wmrl_research.constrain`); plain `generate` does not apply it. "
            if agent["search_constraint"]
            else ""
        )
        + "For edits that apply, in one call: `from wmrl_research.agent import propose_edits; "
        "propose_edits(DIR, TASK_ID, n=8)` (the constraint as a transformers logits processor, "
        "`wmrl_research.agent.KnobEditLogitsProcessor`, for your own `generate`)."
    )
