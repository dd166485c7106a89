"""The research domain's outcome world models, registered by name (``--domain.world_model=<name>``).

A kind owns what differs between them: building the model for a run (:meth:`WMKind.build`), filling
it from a checkpoint (:meth:`WMKind.load_checkpoint`) and writing it to an export folder
(:meth:`WMKind.export`). Light to import: torch, transformers and scikit-learn load when a method runs.

- ``surrogate`` / ``surrogate_hgb``: knob values parsed from the knobs block -> per-task extra trees /
  gradient boosting (``world_models/knob_surrogate.py``); exported as the plain executions they refit on.
- ``code``: frozen MiniLM + token codes -> pooled extra trees (``world_models/code_outcome.py``).
- ``encoder``: a transformer-encoder ensemble over the text; exported as safetensors + config.
- ``lm``: a causal LM of the policy's architecture answering ``runs: ..; valid: ..; quality: q``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from wmrl.config import RunConfig


class ResearchConfig(Protocol):
    """The fields of the research domain's config (wmrl_research/config.py, which imports this
    module for its choices) that the world-model kinds read."""

    world_model: str | None
    policy: str
    tiny_hidden: int
    tiny_layers: int
    wm_members: int
    wm_dim: int
    wm_lm_samples: int
    wm_batch_size: int
    wm_lr: float
    cache_dir: str


WM_KINDS: dict[str, type[WMKind]] = {}


def register_wm_kind(cls: type[WMKind]) -> type[WMKind]:
    """Class decorator: ``cls`` becomes the choice ``--domain.world_model=<cls.name>``."""
    if cls.name in WM_KINDS:
        raise ValueError(f"research world-model kind {cls.name!r} is registered twice")
    WM_KINDS[cls.name] = cls
    return cls


def wm_kind(cfg: ResearchConfig) -> WMKind:
    """The registered kind of ``cfg.world_model``."""
    if cfg.world_model not in WM_KINDS:
        raise ValueError(f"world_model={cfg.world_model!r} is not one of {', '.join(WM_KINDS)}")
    return WM_KINDS[cfg.world_model](cfg)


def surrogate_tasks(tasks: list[Any]) -> dict[str, tuple[dict[str, list[str]], dict[str, str]]]:
    """What the knob surrogate is given of each task: task text -> (knob space, baseline values), as
    Python value sources (``format_value``; the baseline's as written in its knobs block)."""
    from wmrl_research.domain import task_text
    from wmrl_research.edits import format_value, knobs_block, parse_knobs

    out = {}
    for t in tasks:
        space = {k: [format_value(v) for v in vs] for k, vs in t.knob_space.items()}
        out[task_text(t)] = (space, parse_knobs(knobs_block(t.baseline_source)))
    return out


def lm_size(cfg: ResearchConfig) -> dict[str, int]:
    """``load_lm``'s size arguments: the tiny policy's hidden width and depth (none for a named LM)."""
    return {"hidden": cfg.tiny_hidden, "layers": cfg.tiny_layers} if cfg.policy == "tiny" else {}


class WMKind:
    """One kind of outcome world model for a domain config ``cfg``."""

    name: ClassVar[str]
    # checkpointed as its whole state (``state_dict_full``: data it refits on), not torch parameters
    full_state: ClassVar[bool] = False

    def __init__(self, cfg: ResearchConfig) -> None:
        self.cfg = cfg

    def build(self, run: RunConfig, tokenizer: Any = None, device: torch.device | str = "cpu"):
        """The model, untrained; the text kinds read with ``tokenizer`` (the policy's) and sit on
        ``device`` (the policy's)."""
        raise NotImplementedError

    def load_checkpoint(self, wm, state: dict[str, Any]) -> None:
        """Fill ``wm`` from the run checkpoint's ``domain.world_model`` entry, strictly."""
        if self.full_state:
            wm.load_state_dict_full(state)
        else:
            wm.load_state_dict(state["params"], strict=True)

    def export(
        self, wm, state: dict[str, Any], run: RunConfig, tasks: list[Any], wm_dir: Path
    ) -> dict[str, Any]:
        """Write ``wm`` to ``wm_dir``; its ``export.json`` entry (format, class, how to load it)."""
        raise ValueError(
            f"wmrl export cannot write a domain.world_model={self.name} WM yet (surrogate, surrogate_hgb, "
            "encoder and lm can)"
        )


@register_wm_kind
class Surrogate(WMKind):
    name = "surrogate"
    estimator: ClassVar[str] = "extra_trees"
    full_state = True

    def build(self, run: RunConfig, tokenizer: Any = None, device: torch.device | str = "cpu"):
        from wmrl_research.tasks import list_tasks
        from world_models.knob_surrogate import KnobSurrogateOutcomeModel

        return KnobSurrogateOutcomeModel(
            surrogate_tasks(list_tasks()),
            estimator=self.estimator,
            members=self.cfg.wm_members,
            seed=run.seed,
        )

    def export(
        self, wm, state: dict[str, Any], run: RunConfig, tasks: list[Any], wm_dir: Path
    ) -> dict[str, Any]:
        # scikit-learn trees are refitted from the executions they learned from (deterministic for
        # the seed), so the export is that plain data, no pickle.
        wm_dir.mkdir(parents=True, exist_ok=True)
        spec = {
            "estimator": wm.estimator,
            "members": self.cfg.wm_members,
            "seed": run.seed,
            "tasks": surrogate_tasks(tasks),
            "state": state,
        }
        (wm_dir / "knob_surrogate.json").write_text(json.dumps(spec, indent=1))
        return {
            "format": "JSON: task knob spaces and the executions the scikit-learn surrogate refits on",
            "class": "world_models.knob_surrogate.KnobSurrogateOutcomeModel",
            "load": "from world_models.knob_surrogate import KnobSurrogateOutcomeModel\n"
            "wm = KnobSurrogateOutcomeModel.from_export(f'{DIR}/world_model/knob_surrogate.json')",
        }


@register_wm_kind
class SurrogateHGB(Surrogate):
    name = "surrogate_hgb"
    estimator = "hgb"


@register_wm_kind
class Code(WMKind):
    name = "code"
    full_state = True

    def build(self, run: RunConfig, tokenizer: Any = None, device: torch.device | str = "cpu"):
        from wmrl_research.tasks import list_tasks
        from world_models.code_outcome import CodeOutcomeModel, MiniLMEmbedder

        return CodeOutcomeModel(
            surrogate_tasks(list_tasks()), MiniLMEmbedder(self.cfg.cache_dir), seed=run.seed
        )


class TextWM(WMKind):
    """The kinds that read the text with the policy's tokenizer."""

    def build(self, run: RunConfig, tokenizer: Any = None, device: torch.device | str = "cpu"):
        if tokenizer is None:
            raise ValueError(f"world_model={self.name!r} needs the policy's tokenizer")
        return self.build_text(run, tokenizer).to(device)

    def build_text(self, run: RunConfig, tokenizer: Any):
        raise NotImplementedError


@register_wm_kind
class Encoder(TextWM):
    name = "encoder"

    def build_text(self, run: RunConfig, tokenizer: Any):
        from world_models.outcome import EncoderOutcomeModel

        cfg = self.cfg
        return EncoderOutcomeModel(
            tokenizer, members=cfg.wm_members, dim=cfg.wm_dim, batch_size=cfg.wm_batch_size, lr=cfg.wm_lr,
            seed=run.seed,
        )  # fmt: skip

    def export(
        self, wm, state: dict[str, Any], run: RunConfig, tasks: list[Any], wm_dir: Path
    ) -> dict[str, Any]:
        wm.var_scale = float(state.get("var_scale", 1.0))
        wm.save_pretrained(wm_dir)
        return {
            "format": "safetensors + config.json + tokenizer",
            "class": "world_models.outcome.EncoderOutcomeModel",
            "load": "from world_models.outcome import EncoderOutcomeModel\n"
            "wm = EncoderOutcomeModel.from_pretrained(f'{DIR}/world_model')\n"
            "mean, var = wm.predict(task_texts, solution_texts)   # wmrl_research.domain.task_text / solution_text",
        }


@register_wm_kind
class OutcomeLM(TextWM):
    """A causal LM of the policy's architecture, initialised like it (shares the tokenizer)."""

    name = "lm"

    def build_text(self, run: RunConfig, tokenizer: Any):
        from wmrl_research.lm import load_lm
        from wmrl_research.policy import ResearchPolicy
        from wmrl_research.tasks import FAILURE_SCORE
        from world_models.outcome import LMOutcomeModel

        cfg = self.cfg
        lm_model, tok = load_lm(cfg.policy, tokenizer, Path(cfg.cache_dir), seed=run.seed + 1, **lm_size(cfg))
        lm = ResearchPolicy(lm_model, tok, temperature=1.0, max_new_tokens=48)
        return LMOutcomeModel(
            lm, samples=cfg.wm_lm_samples, failure_score=FAILURE_SCORE, batch_size=cfg.wm_batch_size,
            lr=cfg.wm_lr, seed=run.seed,
        )  # fmt: skip

    def export(
        self, wm, state: dict[str, Any], run: RunConfig, tasks: list[Any], wm_dir: Path
    ) -> dict[str, Any]:
        wm.lm.model.save_pretrained(str(wm_dir))
        wm.lm.tokenizer.save_pretrained(str(wm_dir))
        (wm_dir / "wmrl_outcome_lm.json").write_text(
            json.dumps(
                {"samples": wm.samples, "lo": wm.lo, "hi": wm.hi, "failure_score": wm.failure_score}, indent=2
            )
        )
        return {
            "format": "transformers causal LM (safetensors) answering `runs: ..; valid: ..; quality: q`",
            "class": "world_models.outcome.LMOutcomeModel",
            "load": "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "wm = AutoModelForCausalLM.from_pretrained(f'{DIR}/world_model')   # prompt: LMOutcomeModel.prompt",
        }
