"""Warm start: supervised fine-tuning on valid edits generated from each task's knob space.

The targets are random knobs-mode edits (1..``max_changes`` knobs set to another candidate value),
so after SFT the policy writes well-formed, applicable edits and spreads its choices over the knob
space; GRPO then learns which choices score well. In ``free`` mode (``SFTConfig.mode``) the prompts
show the whole solution and the targets are random free-form code edits
(:func:`wmrl_research.code_edits.sample_code_edit`: mutations outside the knobs block, half of them
with a knob edit too), so the policy learns to copy lines of the program into SEARCH texts.

With ``synthetic_fraction > 0`` that fraction of each batch comes from synthetic tasks (random knobs
blocks in the same format, :func:`wmrl_research.edits.synthetic_task`), drawn fresh every step: a
small policy then learns to copy a knob line of its prompt and rewrite its value, instead of
memorising the training tasks' lines, and its edits of tasks it has never seen apply.

Data-parallel (``accelerator`` with N processes, ``accelerate launch`` / ``torchrun``): every rank
draws the same batch (same seed), keeps its contiguous share of it and sums its tokens' NLL over the
*whole* batch's token count times N, so DDP's gradient mean (or FSDP's reduce-scatter) is the
1-process gradient of the whole batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from wmrl.distributed import task_shares
from wmrl_research.code_edits import sample_code_edit
from wmrl_research.edits import apply_edits, randomise_knobs, sample_knob_edit, synthetic_task
from wmrl_research.policy import ResearchPolicy, sequence_nll
from wmrl_research.prompts import build_prompt, encode_prompts


@dataclass
class SFTConfig:
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    max_changes: int = 2
    seed: int = 0
    prompt_style: str = "full"
    synthetic_fraction: float = 0.0
    randomise_fraction: float = 0.0
    mode: str = "knobs"
    # Prompts longer than this keep their last tokens, as in rollouts (domain.max_prompt_tokens).
    max_prompt_tokens: int = 512


def sft_target(source: str, knob_space: Any, rng: random.Random, max_changes: int, mode: str) -> str:
    """One SFT completion for ``source``: a random knob edit (``knobs``), or a random free-form code
    edit (``free``; a knob edit where the program offers no code mutation, e.g. a synthetic task)."""
    if mode == "free":
        try:
            return sample_code_edit(source, rng, max_changes, knob_space)
        except ValueError:
            pass
    return sample_knob_edit(source, knob_space, rng, max_changes)


def sft_examples(
    tasks: Sequence[Any],
    n: int,
    rng: random.Random,
    max_changes: int = 2,
    style: str = "full",
    synthetic_fraction: float = 0.0,
    randomise_fraction: float = 0.0,
    mode: str = "knobs",
) -> list[tuple[str, str]]:
    """``n`` (prompt, completion) pairs, prompts and targets in ``mode`` (:func:`sft_target`): each one,
    with probability ``synthetic_fraction``, from a fresh synthetic task, else from a task of ``tasks``
    (uniformly), whose knobs are, with probability ``randomise_fraction``, first moved to a random
    point of its knob space (:func:`~wmrl_research.edits.randomise_knobs`; the edit then starts from
    there)."""
    if not tasks and synthetic_fraction < 1:
        raise ValueError("SFT needs at least one task")
    prompts = {t.id: build_prompt(t, t.baseline_source, mode, style) for t in tasks}
    out = []
    for _ in range(n):
        if synthetic_fraction > 0 and rng.random() < synthetic_fraction:
            t = synthetic_task(rng)
            src, prompt = t.baseline_source, build_prompt(t, t.baseline_source, mode, style)
        else:
            t = rng.choice(list(tasks))
            src, prompt = t.baseline_source, prompts[t.id]
            if randomise_fraction > 0 and rng.random() < randomise_fraction:
                src = randomise_knobs(src, t.knob_space, rng)
                prompt = build_prompt(t, src, mode, style)
        out.append((prompt, sft_target(src, t.knob_space, rng, max_changes, mode)))
    return out


class SummedNLL(torch.nn.Module):
    """``forward(prompts, completions)`` -> the summed NLL of the completions' real tokens (+ EOS),
    a module so that DDP / FSDP (which hook ``forward``) wrap the policy's SFT loss."""

    def __init__(self, policy: ResearchPolicy, max_prompt_tokens: int = 512):
        super().__init__()
        self.policy = policy
        self.max_prompt_tokens = max_prompt_tokens

    def forward(self, prompts: Sequence[str], completions: Sequence[str]) -> torch.Tensor:
        p_ids, p_mask = encode_prompts(self.policy.tokenizer, prompts, self.max_prompt_tokens)
        c_ids, c_mask = self.policy.encode_completions(completions)
        lp = self.policy.completion_log_probs(p_ids, p_mask, c_ids, temperature=1.0)
        return -(lp * c_mask.to(lp.device)).sum()


def share_nll(
    model: torch.nn.Module, policy: ResearchPolicy, pairs: list[tuple[str, str]], rank: int, world: int
) -> torch.Tensor:
    """This rank's share of the batch's mean token NLL: ``sum_{i in share} nll_i / T_batch``, where
    ``T_batch`` counts the whole batch's completion tokens; the shares sum to the batch's mean NLL.
    A rank with no row (batch smaller than ``world``) runs one row times 0 (DDP needs every rank)."""
    share = task_shares(len(pairs), world)[rank]
    mine = pairs[share.start : share.stop]
    idle = not mine
    mine = mine or pairs[:1]
    tokens = policy.encode_completions([c for _, c in pairs])[1].sum().clamp(min=1)
    loss = model([p for p, _ in mine], [c for _, c in mine]) / tokens.to(policy_device(policy))
    return loss * 0.0 if idle else loss


def policy_device(policy: torch.nn.Module) -> torch.device:
    return next(policy.parameters()).device


def run_sft(policy: ResearchPolicy, tasks: Sequence[Any], cfg: SFTConfig, accelerator=None) -> list[float]:
    """Train ``policy`` (its trainable parameters) on fresh edit samples; returns the loss per step.

    With an ``accelerator`` (any number of processes): the policy's loss runs through the prepared
    (DDP / FSDP) :class:`SummedNLL`, each rank on its share of every batch (:func:`share_nll`), and
    the returned losses are the whole batch's (summed over ranks)."""
    rng = random.Random(cfg.seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / cfg.steps)
    )
    model = None
    if accelerator is not None:  # the scheduler stays on the plain optimizer: one step per step
        model, opt = accelerator.prepare(SummedNLL(policy, cfg.max_prompt_tokens), opt)
        params = [p for p in model.parameters() if p.requires_grad]  # FSDP's own (flat) parameters
    policy.train()
    losses = []
    for _ in range(cfg.steps):
        pairs = sft_examples(
            tasks,
            cfg.batch_size,
            rng,
            cfg.max_changes,
            cfg.prompt_style,
            cfg.synthetic_fraction,
            cfg.randomise_fraction,
            cfg.mode,
        )
        opt.zero_grad()
        if model is None:
            loss = sequence_nll(policy, [p for p, _ in pairs], [c for _, c in pairs], cfg.max_prompt_tokens)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        else:
            world = accelerator.num_processes
            local = share_nll(model, policy, pairs, accelerator.process_index, world)
            accelerator.backward(local * world)
            accelerator.clip_grad_norm_(params, 1.0)
            loss = accelerator.reduce(local.detach(), "sum")
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    policy.eval()
    return losses


@torch.no_grad()
def edit_validity(
    policy: ResearchPolicy,
    tasks: Sequence[Any],
    samples_per_task: int,
    generator: torch.Generator,
    mode: str = "knobs",
    style: str = "full",
    max_prompt_tokens: int = 512,
) -> dict[str, float]:
    """Fraction of sampled completions that parse and apply (``apply_fraction``), and that change
    the solution (``change_fraction``), over ``samples_per_task`` samples per task (prompts cut to
    their last ``max_prompt_tokens`` tokens, as in rollouts)."""
    prompts = [
        build_prompt(t, t.baseline_source, mode, style) for t in tasks for _ in range(samples_per_task)
    ]
    ids, mask = encode_prompts(policy.tokenizer, prompts, max_prompt_tokens)
    s = policy.sample(ids, mask, generator)
    owners = [t for t in tasks for _ in range(samples_per_task)]
    applied = changed = 0
    for t, text in zip(owners, s.texts, strict=True):
        res = apply_edits(t.baseline_source, text, mode)
        applied += res.ok
        changed += res.ok and res.source != t.baseline_source
    n = max(len(prompts), 1)
    return {"apply_fraction": applied / n, "change_fraction": changed / n, "n": float(n)}
