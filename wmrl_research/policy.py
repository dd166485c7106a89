"""The research agent's policy: a causal LM that writes search/replace edits, with batched sampling and
exact completion log-probs for the clipped-ratio loss.

The policy's distribution is ``softmax(logits / temperature)``: sampling and :meth:`log_probs` use the
same temperature, so the sampler's log-probs and the recomputed ones agree (the PPO ratio is 1 at
the first epoch). Temperature 0 means greedy decoding (log-probs then at temperature 1).

With ``search_constraint=True`` and per-row ``sources`` given to :meth:`ResearchPolicy.sample`, SEARCH
texts are decoded under the knob-line constraint of :mod:`wmrl_research.constrain`: the distribution
is then the softmax renormalised over the allowed ids at each constrained position, and the masks
travel in the batch extras so that :meth:`ResearchPolicy.log_probs` recomputes the same log-probs.

The models it wraps come from :mod:`wmrl_research.lm`; its prompts from :mod:`wmrl_research.prompts`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from wmrl.domain import RolloutBatch
from wmrl_research.constrain import (
    EXTRA_ALLOWED,
    EXTRA_CONSTRAINED,
    SearchConstraint,
    TokenIndex,
    knob_value_sources,
    masked_logits,
    masked_token_log_probs,
    pad_allowed,
    token_bytes,
)
from wmrl_research.prompts import encode_prompts


@dataclass
class Samples:
    """Sampled completions. ``tokens``, ``logprobs``, ``mask``: ``[B, T]``; ``texts``: B strings.

    Under the search constraint: ``allowed`` ``[B, T, K]`` (allowed ids, -1 padded) and
    ``constrained`` ``[B, T]`` bool; both None when no constraint was applied.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    texts: list[str]
    allowed: torch.Tensor | None = None
    constrained: torch.Tensor | None = None

    def extras(self) -> dict[str, torch.Tensor]:
        """The constraint's masks as RolloutBatch extras (empty without a constraint)."""
        if self.allowed is None or self.constrained is None:
            return {}
        return {EXTRA_ALLOWED: self.allowed, EXTRA_CONSTRAINED: self.constrained}


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class ResearchPolicy(nn.Module):
    """A causal LM as a policy over completions (edits), given prompts.

    ``log_probs(batch)`` reads ``batch.extras["prompt_ids"]`` / ``["prompt_mask"]`` (``[N, P]``) and
    scores ``batch.tokens`` (``[N, T]``) differentiably, under the search constraint's masks where the
    batch carries them (``search_allowed`` ``[N, T, K]``, ``search_constrained`` ``[N, T]``).

    ``search_constraint``: decode SEARCH texts under the knob-line constraint whenever
    :meth:`sample` gets the rows' ``sources`` (knobs mode); off: today's unconstrained sampling.
    ``constrain_replace``: also make each REPLACE text start with the chosen knob's ``NAME =``.
    ``constrain_values``: make each whole REPLACE text ``NAME = value`` with a value of the knob's
    declared space, for the rows whose ``knob_spaces`` :meth:`sample` gets.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        search_constraint: bool = False,
        constrain_replace: bool = False,
        constrain_values: bool = False,
    ):
        super().__init__()
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.search_constraint = search_constraint
        self.constrain_replace = constrain_replace
        self.constrain_values = constrain_values
        self._token_index: tuple[list[bytes | None], TokenIndex] | None = None

    def token_index(self) -> tuple[list[bytes | None], TokenIndex]:
        """Each vocabulary id's bytes and the allowed-id lookup, built once per policy."""
        if self._token_index is None:
            pieces = token_bytes(self.tokenizer)
            self._token_index = (pieces, TokenIndex(pieces))
        return self._token_index

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def _scale(self, logits: torch.Tensor, temperature: float | None = None) -> torch.Tensor:
        t = self.temperature if temperature is None else temperature
        return logits.float() / (t if t > 0 else 1.0)

    @torch.no_grad()
    def sample(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        generator: torch.Generator | None = None,
        max_new_tokens: int | None = None,
        greedy: bool = False,
        sources: Sequence[str] | None = None,
        knob_spaces: Sequence[Any] | None = None,
    ) -> Samples:
        """Sample one completion per prompt row (repeat rows for G per task), with a KV cache.

        Stops at EOS; tokens after EOS are PAD with mask 0 (the EOS token itself has mask 1).
        ``sources`` (one per row, the solution each row edits): with ``search_constraint`` on, SEARCH
        texts can only be knob lines of the row's source (:mod:`wmrl_research.constrain`);
        ``knob_spaces`` (one per row, ``{name: [value, ...]}``): with ``constrain_values`` on too,
        REPLACE texts can only set the knob to a value of its space.
        """
        was_training = self.model.training
        self.model.eval()
        steps = max_new_tokens or self.max_new_tokens
        greedy = greedy or self.temperature == 0
        dev = next(self.model.parameters()).device
        ids, attn = prompt_ids.to(dev), prompt_mask.to(dev)
        pos = _positions(attn)
        # only the last position's logits: every position's, [B, P, V] in float32, would be the
        # largest tensor of the run for a real vocabulary (SmolLM2: 32 prompts x 512 x 49k = 3.2 GB)
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        past, logits = out.past_key_values, out.logits[:, -1]
        b = ids.shape[0]
        finished = torch.zeros(b, dtype=torch.bool, device=dev)
        toks, lps, masks = [], [], []
        constraint = None
        if self.search_constraint and sources is not None:
            if len(sources) != b:
                raise ValueError(f"{len(sources)} sources for {b} prompt rows")
            pieces, index = self.token_index()
            values = None
            if self.constrain_values and knob_spaces is not None:
                if len(knob_spaces) != b:
                    raise ValueError(f"{len(knob_spaces)} knob spaces for {b} prompt rows")
                values = [None if ks is None else knob_value_sources(ks) for ks in knob_spaces]
            constraint = SearchConstraint(
                index, pieces, sources, replace_name=self.constrain_replace, values=values
            )
        steps_allowed: list[list[tuple[int, ...] | None]] = []
        last_pos = pos[:, -1:]
        for _ in range(steps):
            z = self._scale(logits)  # [B, V]
            live = ~finished
            rows_allowed = constraint.allowed() if constraint is not None else []
            allowed = flag = None
            if any(a is not None for a in rows_allowed):
                allowed, flag = pad_allowed([rows_allowed], b)  # [B, 1, K], [B, 1]
                allowed, flag = allowed.to(dev), flag.to(dev)
                logp = torch.log_softmax(masked_logits(z, allowed[:, 0]), dim=-1)
            else:
                logp = torch.log_softmax(z, dim=-1)  # [B, V]
            if greedy:
                nxt = logp.argmax(-1)
            else:
                nxt = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(-1).to(dev)
            nxt = torch.where(live, nxt, torch.full_like(nxt, self.pad_id))
            toks.append(nxt)
            if allowed is None:
                step_lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
            else:
                step_lp = masked_token_log_probs(z[:, None], nxt[:, None], allowed, flag)[:, 0]
            lps.append(torch.where(live, step_lp, torch.zeros(b, device=dev)))
            masks.append(live.float())
            if constraint is not None:
                steps_allowed.append(
                    [a if bool(alive) else None for a, alive in zip(rows_allowed, live.tolist(), strict=True)]
                )
                constraint.advance(nxt.tolist(), live.tolist())
            finished = finished | (nxt == self.eos_id)
            if bool(finished.all()):
                break
            attn = torch.cat([attn, torch.ones(b, 1, dtype=attn.dtype, device=dev)], dim=1)
            last_pos = last_pos + 1
            out = self.model(
                input_ids=nxt[:, None],
                attention_mask=attn,
                position_ids=last_pos,
                past_key_values=past,
                use_cache=True,
            )
            past, logits = out.past_key_values, out.logits[:, -1]
        self.model.train(was_training)
        tokens = torch.stack(toks, 1).cpu()
        mask = torch.stack(masks, 1).cpu()
        texts = [self.decode(t, m) for t, m in zip(tokens, mask, strict=True)]
        allowed_all = flags_all = None
        if constraint is not None:
            allowed_all, flags_all = pad_allowed(steps_allowed, b)  # [B, T, K], [B, T]
        return Samples(tokens, torch.stack(lps, 1).cpu(), mask, texts, allowed_all, flags_all)

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> str:
        ids = [int(t) for t, m in zip(tokens, mask, strict=True) if m > 0 and int(t) != self.eos_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def completion_log_probs(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        tokens: torch.Tensor,
        temperature: float | None = None,
        allowed: torch.Tensor | None = None,
        constrained: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[N, T]`` log-probs of ``tokens`` after left-padded prompts (differentiable), at the
        policy's temperature unless ``temperature`` is given; renormalised over ``allowed``
        (``[N, T, K]``, -1 padded) where ``constrained`` (``[N, T]``), as the sampler drew them."""
        dev = next(self.model.parameters()).device
        ids = torch.cat([prompt_ids, tokens], 1).to(dev)
        attn = torch.cat([prompt_mask.long(), torch.ones_like(tokens, dtype=torch.long)], 1).to(dev)
        # only the last T + 1 positions' logits: a [N, P + T, V] tensor would dominate memory for a
        # real vocabulary (SmolLM2: 49k) and a whole solution in the prompt
        t = tokens.shape[1]
        logits = self.model(
            input_ids=ids, attention_mask=attn, position_ids=_positions(attn), logits_to_keep=t + 1
        ).logits
        logits = self._scale(logits[:, :-1], temperature)  # [N, T, V]: position p-1+t predicts token t
        return masked_token_log_probs(
            logits,
            tokens.to(dev),
            None if allowed is None else allowed.to(dev),
            None if constrained is None else constrained.to(dev),
        )

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        return self.completion_log_probs(
            batch.extras["prompt_ids"],
            batch.extras["prompt_mask"],
            batch.tokens,
            allowed=batch.extras.get(EXTRA_ALLOWED),
            constrained=batch.extras.get(EXTRA_CONSTRAINED),
        )

    def encode_completions(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded completion ids ``[B, T]`` ending in EOS, and their mask (for SFT)."""
        rows = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.eos_id] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width))
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return ids, mask

    def encode(self, prompts: Sequence[str], max_tokens: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask ``[B, P]`` (see :func:`encode_prompts`)."""
        return encode_prompts(self.tokenizer, prompts, max_tokens)

    def nll(self, prompts: Sequence[str], completions: Sequence[str]) -> torch.Tensor:
        """Mean per-token NLL of ``completions`` (+ EOS) given ``prompts`` at temperature 1."""
        return sequence_nll(self, prompts, completions)

    def n_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def sequence_nll(
    policy: ResearchPolicy, prompts: Sequence[str], completions: Sequence[str], max_prompt: int = 512
):
    """Mean per-token negative log-likelihood of ``completions`` given ``prompts`` (SFT loss)."""
    p_ids, p_mask = encode_prompts(policy.tokenizer, prompts, max_prompt)
    c_ids, c_mask = policy.encode_completions(completions)
    lp = policy.completion_log_probs(p_ids, p_mask, c_ids, temperature=1.0)
    return -(lp * c_mask.to(lp.device)).sum() / c_mask.sum().clamp(min=1)


def perplexity(nll: float) -> float:
    return math.exp(min(nll, 50.0))
