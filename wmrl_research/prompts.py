"""The research agent's prompts: the task, the current solution and the edit format, as text and
as left-padded token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

PROMPT_STYLES = ("full", "short")


def build_prompt(task: Any, source: str, mode: str, style: str = "full") -> str:
    """The prompt: the task, the current solution and the edit format.

    ``full``: the task description, the metric, the knob choices, the current solution (its knobs
    as ``NAME = value`` lines in knobs mode, the whole file in free mode) and the instructions.
    ``short`` (knobs mode, for tiny models): the task id, kind and metric, then one line per knob
    with its current value and its choices; about half the tokens.
    """
    from wmrl_research.edits import format_value, knobs_view, parse_knobs

    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r} is not one of {', '.join(PROMPT_STYLES)}")
    better = "higher" if task.direction in (1, "max") else "lower"
    space = getattr(task, "knob_space", None) or {}
    if style == "short":
        if mode != "knobs":
            raise ValueError("the short prompt style needs edit mode 'knobs'")
        lines = [f"Task: {task.id} ({task.kind}), {task.metric}, {better} is better"]
        for k, v in parse_knobs(_knobs(source)).items():
            choices = " | ".join(format_value(x) for x in space.get(k, []))
            lines.append(f"{k} = {v}" + (f"  # {choices}" if choices else ""))
        return "\n".join(lines + ["Edit:", ""])
    if mode == "knobs":
        body = knobs_view(source)
        where = "Edit only lines of the knobs block."
    else:
        body = source
        where = "Edit any lines of solution.py."
    lines = [f"Task: {task.description.strip()}", f"Metric: {task.metric} ({better} is better)"]
    if space:
        lines.append(
            "Choices: "
            + "; ".join(f"{k}: {' | '.join(format_value(v) for v in vs)}" for k, vs in space.items())
        )
    lines += [
        "Current solution:" if mode == "free" else "Current knobs:",
        body.rstrip("\n"),
        f"Reply with SEARCH/REPLACE blocks. {where}",
        "Edit:",
        "",
    ]
    return "\n".join(lines)


def _knobs(source: str) -> str:
    from wmrl_research.edits import knobs_block

    return knobs_block(source)


def encode_prompts(
    tokenizer, prompts: Sequence[str], max_tokens: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``ids [B, P]`` and ``mask [B, P]``; a BOS token first where the tokenizer has one;
    prompts longer than ``max_tokens`` keep their last ``max_tokens`` tokens."""
    rows = []
    for p in prompts:
        ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        if tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id] + ids
        rows.append(ids[-max_tokens:])
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, mask
