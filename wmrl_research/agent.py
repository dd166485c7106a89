"""The exported research agent, used as the run used it: one call from an export folder to an edit.

A research run samples its edits under a constraint (:mod:`wmrl_research.constrain`): every SEARCH
text is a knob line of the current solution and, with knob spaces, every REPLACE text sets that knob
to a value of its declared space. Plain ``model.generate`` has none of it, and a small agent's free
text rarely applies (a SEARCH text not found, a value out of range). Here the constraint is a
``transformers`` logits processor, so ``generate`` decodes as training did::

    from wmrl_research.agent import propose_edits
    edits = propose_edits("DIR", "iris_cls", n=8)     # DIR: `wmrl export`'s folder; a task id or task
    # -> 8 texts of one SEARCH/REPLACE block each, every one applies (wmrl_research.edits.apply_edits)

or, with the model in hand::

    from wmrl_research.agent import KnobEditLogitsProcessor, load_agent
    model, tokenizer, agent = load_agent("DIR")          # agent: DIR/wmrl_agent.json
    proc = KnobEditLogitsProcessor(tokenizer, [source], prompt_ids.shape[1], knob_spaces=[space])
    out = model.generate(prompt_ids, logits_processor=[proc], ...)

``strict`` (the default): the completion is exactly one block, ``<<<<<<< SEARCH`` first and EOS
right after ``>>>>>>> REPLACE``, so each completion is one usable edit; ``strict=False`` constrains
only the SEARCH (and REPLACE) texts, as the run's sampler did, and leaves the rest free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessor

from wmrl_research.constrain import (
    HEAD,
    SearchConstraint,
    TokenIndex,
    knob_value_sources,
    masked_logits,
    pad_allowed,
    token_bytes,
)
from wmrl_research.edits import REPLACE

AGENT_FILE = "wmrl_agent.json"


class KnobEditLogitsProcessor(LogitsProcessor):
    """A ``transformers`` logits processor (``generate(..., logits_processor=[p])``) that keeps each
    row's completion to knob edits of its ``sources[row]``: scores of disallowed tokens are set to
    -inf. ``prompt_length``: the width of the (left-padded) prompt ids given to ``generate``.
    ``knob_spaces``: per row, ``{name: [value, ...]}`` (a task's ``knob_space``) or None; with one, a
    REPLACE text sets its knob to a value of the space. ``strict``: one whole block, then EOS."""

    def __init__(
        self,
        tokenizer,
        sources: Sequence[str],
        prompt_length: int,
        knob_spaces: Sequence[Mapping[str, Sequence[Any]] | None] | None = None,
        replace_name: bool = True,
        strict: bool = True,
    ):
        pieces = token_bytes(tokenizer)
        self.pieces, self.index = pieces, TokenIndex(pieces)
        values = None
        if knob_spaces is not None:
            values = [None if ks is None else knob_value_sources(ks) for ks in knob_spaces]
        self.constraint = SearchConstraint(
            self.index, pieces, sources, replace_name=replace_name, values=values
        )
        self.prompt_length, self.seen = prompt_length, 0
        self.eos_id = tokenizer.eos_token_id
        self.strict = strict
        self.finished = [False] * len(sources)
        self.closed = [False] * len(sources)  # strict: the block is complete, only EOS is left
        self._end = REPLACE.encode()

    def _advance(self, input_ids: torch.LongTensor) -> None:
        while self.seen < input_ids.shape[1] - self.prompt_length:
            col = input_ids[:, self.prompt_length + self.seen].tolist()
            live = [not f for f in self.finished]
            self.constraint.advance(col, live)
            for r, tok in enumerate(col):
                if live[r] and tok == self.eos_id:
                    self.finished[r] = True
                if self.constraint.text[r].rstrip().endswith(self._end) and self.constraint.body[r] is None:
                    self.closed[r] = True
            self.seen += 1

    def _strict_allowed(self, r: int) -> tuple[int, ...] | None:
        """Outside a SEARCH body, in strict mode: the start of ``<<<<<<< SEARCH`` before the block,
        EOS after it (None: no restriction)."""
        if self.finished[r]:
            return None
        if self.closed[r]:
            return (self.eos_id,)
        text = self.constraint.text[r]
        if HEAD.startswith(text) and text != HEAD:
            rest = HEAD[len(text) :]
            return (
                tuple(i for i, b in enumerate(self.pieces) if b and rest.startswith(b)) or None
            )  # tokens within the marker (none crosses into the body unchecked)
        return None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._advance(input_ids)
        rows = self.constraint.allowed()
        if self.strict:
            rows = [a if a is not None else self._strict_allowed(r) for r, a in enumerate(rows)]
        if all(a is None for a in rows):
            return scores
        allowed, _ = pad_allowed([rows], len(rows))
        return masked_logits(scores, allowed[:, 0].to(scores.device))


def load_agent(export_dir: str | Path) -> tuple[Any, Any, dict]:
    """``(model, tokenizer, agent)`` of a `wmrl export` folder: the causal LM and its tokenizer
    (transformers), and ``wmrl_agent.json`` (how the run prompted and sampled)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export_dir = Path(export_dir)
    agent_file = export_dir / AGENT_FILE
    if not agent_file.is_file():
        raise FileNotFoundError(
            f"{export_dir} holds no {AGENT_FILE}: not a research agent exported by `wmrl export`"
        )
    agent = json.loads(agent_file.read_text())
    model = AutoModelForCausalLM.from_pretrained(str(export_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(export_dir))
    model.eval()
    return model, tokenizer, agent


def propose_edits(
    export_dir: str | Path | tuple[Any, Any, dict],
    task: Any,
    n: int = 1,
    source: str | None = None,
    seed: int = 0,
    temperature: float | None = None,
    strict: bool = True,
    max_new_tokens: int | None = None,
) -> list[str]:
    """``n`` edits of ``source`` (default: the task's baseline) by the exported agent, each one
    SEARCH/REPLACE block that applies in knobs mode: prompted as the run prompted, sampled at the
    run's temperature (``temperature`` to change it; 0: greedy) under :class:`KnobEditLogitsProcessor`.

    ``export_dir``: a `wmrl export` folder, or what :func:`load_agent` returned (to load once).
    ``task``: a task id (``wmrl tasks research``) or a task object (``id``, ``kind``, ``metric``,
    ``direction``, ``knob_space``, ``baseline_source``). ``max_new_tokens``: default the run's, at
    least 256 (a strict completion ends at its block's end; a SEARCH text may be a whole knob line
    with its comment, longer than the run's limit, and a cut block does not apply)."""
    from wmrl_research.prompts import build_prompt, encode_prompts

    model, tokenizer, agent = load_agent(export_dir) if isinstance(export_dir, (str, Path)) else export_dir
    if agent.get("edit_mode", "knobs") != "knobs":
        raise ValueError(f"the agent edits in mode {agent['edit_mode']!r}; propose_edits makes knob edits")
    if isinstance(task, str):
        from wmrl_research.tasks import get_task

        task = get_task(task)
    source = task.baseline_source if source is None else source
    prompt = build_prompt(task, source, "knobs", agent.get("prompt_style", "full"))
    ids, mask = encode_prompts(tokenizer, [prompt] * n, agent.get("max_prompt_tokens", 512))
    proc = KnobEditLogitsProcessor(
        tokenizer, [source] * n, ids.shape[1], [task.knob_space] * n, strict=strict
    )
    temp = agent.get("temperature", 1.0) if temperature is None else temperature
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            logits_processor=[proc],
            max_new_tokens=max_new_tokens or max(agent.get("max_new_tokens", 128), 256),
            do_sample=temp > 0,
            temperature=temp if temp > 0 else None,
            top_k=None,
            top_p=None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    return [tokenizer.decode(row[ids.shape[1] :], skip_special_tokens=True) for row in out]
