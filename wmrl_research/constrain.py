"""Constrained decoding of SEARCH texts (knobs mode): the policy can only write SEARCH texts that are
knob lines of the current source.

The rule. A row's completion is tracked as bytes. Right after the row's text ends with
``<<<<<<< SEARCH`` the row is *in a SEARCH body* with partial text ``p = b""``; its targets are the
byte strings ``b"\\n" + line + b"\\n=======\\n"`` for every knob line ``line`` that a knobs-mode SEARCH
text may be (:func:`search_lines`). In a body, token ``s`` (its bytes) is allowed iff

    (p + s) is a prefix of some target,  or  some target is a prefix of (p + s)

(the second case: a token that crosses the divider into the REPLACE text). A body ends when a
target is a prefix of ``p``; the row is then free again (REPLACE text, more blocks, EOS). Special
tokens (EOS included) and tokens with no bytes are never allowed in a body. The policy's
distribution at a constrained position is the softmax renormalised over the allowed ids; every
other position is unconstrained.

Optionally (``replace_name``) each target also holds the start of the REPLACE text,
``NAME =`` of the chosen line, so a REPLACE text must start with the knob its SEARCH text names.
With ``values`` (per row, each knob's declared space as value sources, :func:`knob_value_sources`)
the targets hold the whole REPLACE text and its end marker, one per value of the knob's space:
``NAME = value\n>>>>>>> REPLACE``, so every edit sets a knob to a value of its declared space (a
value outside it can crash the solution: ``BATCH_SIZE =lstm"``, ``C = 1.01``). Knobs with no
declared space are then not editable (no target names them).

Each new block's targets come from the source after the blocks completed so far (so a second block
on the same knob must search the edited line); where those blocks do not apply, from the original
source. A row with no targets is left unconstrained.

The state starts at the end of ``<<<<<<< SEARCH`` (the newline is part of each target): with a
byte-level BPE tokenizer whose pre-tokens split letters from what follows (GPT-2's, the tiny
policy's, SmolLM2's), ``SEARCH`` always ends a token, so no token crosses into a body unchecked.

Tensors carried in a :class:`wmrl.domain.RolloutBatch` (``extras``) so that the differentiable
recomputation uses the same masks as the sampler: ``search_allowed`` ``[N, T, K]`` long, the allowed
ids at each constrained position padded with -1, and ``search_constrained`` ``[N, T]`` bool.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch

from wmrl_research.edits import (
    DIVIDER,
    REPLACE,
    EditError,
    apply_edits,
    format_value,
    knobs_block,
    knobs_span,
)

HEAD = b"<<<<<<< SEARCH"
TAIL = ("\n" + DIVIDER + "\n").encode()
EXTRA_ALLOWED = "search_allowed"
EXTRA_CONSTRAINED = "search_constrained"
_CACHE_LIMIT = 200_000


# --------------------------------------------------------------------------------------------------
# Targets


def search_lines(source: str, start: str | None = None, end: str | None = None) -> list[str]:
    """The SEARCH texts a knobs-mode block may use on ``source``, in block order.

    For each unindented ``NAME = value`` line of the knobs block: its compact form
    ``NAME = value`` (as :func:`wmrl_research.edits.knob_edit` writes it, comments dropped) and the
    whole line; each kept only where it occurs exactly once in ``source`` (``apply_edits``' rule; a
    text that occurs once and lies in a block line lies inside the knobs block). Empty when the
    source has no knobs block.
    """
    from wmrl_research.edits import _KNOB_LINE

    try:
        block = knobs_block(source, start, end)
    except EditError:
        return []
    out: list[str] = []
    for line in block.splitlines():
        m = _KNOB_LINE.match(line.strip())
        if not m or line.startswith((" ", "\t")):
            continue
        for text in (f"{m.group('name')} = {m.group('value')}", line):
            if text not in out and DIVIDER not in text and source.count(text) == 1:
                out.append(text)
    return out


def knob_value_sources(knob_space: Mapping[str, Sequence[Any]]) -> dict[str, list[str]]:
    """A task's knob space as the value sources a REPLACE text may use (``format_value``)."""
    return {k: [format_value(v) for v in vs] for k, vs in knob_space.items()}


def targets_for(
    lines: Sequence[str], replace_name: bool = False, values: Mapping[str, Sequence[str]] | None = None
) -> tuple[bytes, ...]:
    """Byte targets of a body: ``b"\\n" + line + b"\\n=======\\n"`` per line (sorted, unique); with
    ``replace_name``, followed by the line's ``NAME =`` (the start of the REPLACE text); with
    ``values`` (knob name -> value sources), followed instead by ``NAME = value\\n>>>>>>> REPLACE``
    for each value of the knob's space (lines of knobs that ``values`` does not name are left out)."""
    out = set()
    for line in lines:
        name = line.split("=", 1)[0].strip()
        head = b"\n" + line.encode() + TAIL
        if values is not None:
            for v in values.get(name, ()):
                out.add(head + f"{name} = {v}\n{REPLACE}".encode())
        else:
            out.add(head + (f"{name} =".encode() if replace_name else b""))
    return tuple(sorted(out))


def block_targets(
    source: str,
    text_before: str,
    start: str | None = None,
    end: str | None = None,
    replace_name: bool = False,
    values: Mapping[str, Sequence[str]] | None = None,
) -> tuple[bytes, ...]:
    """Targets of a block that starts after ``text_before`` (the completion so far): the knob lines of
    ``source`` after the complete blocks of ``text_before``, or of ``source`` itself where
    ``text_before`` holds no block or its blocks do not apply."""
    if HEAD.decode() in text_before:
        res = apply_edits(source, text_before, "knobs", start, end)
        if res.ok and res.source is not None:
            try:
                knobs_span(res.source, start, end)
                return targets_for(search_lines(res.source, start, end), replace_name, values)
            except EditError:
                pass
    return targets_for(search_lines(source, start, end), replace_name, values)


# --------------------------------------------------------------------------------------------------
# Token strings and the allowed-id lookup


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character -> byte table (inverse of ``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def token_bytes(tokenizer) -> list[bytes | None]:
    """Each vocabulary id's bytes (``None`` for special tokens), indexed by id.

    Byte-level BPE pieces are mapped through GPT-2's byte table (exact, also for pieces that are
    not valid UTF-8 on their own); other pieces fall back to decoding the id alone. Raises
    ValueError when concatenating token bytes does not reproduce ``tokenizer.decode`` on a probe.
    """
    table = _byte_decoder()
    special = set(tokenizer.all_special_ids)
    n = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
        elif all(ch in table for ch in piece):
            out.append(bytes(table[ch] for ch in piece))
        else:
            out.append(tokenizer.decode([i]).encode("utf-8"))
    probe = '<<<<<<< SEARCH\nALPHA = 1.0\n=======\nALPHA = "x y"\n>>>>>>> REPLACE'
    ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
    joined = b"".join(out[i] or b"" for i in ids)
    if joined.decode("utf-8", errors="replace") != tokenizer.decode(ids, skip_special_tokens=True):
        raise ValueError(
            "the search constraint needs a tokenizer whose tokens decode independently "
            "(byte-level BPE); decoding token by token does not reproduce tokenizer.decode"
        )
    return out


class TokenIndex:
    """Allowed-id lookup over one vocabulary (built once per tokenizer).

    ``by_bytes``: token bytes -> ids; ``ordered``: (bytes, id) sorted, for the rare tokens longer
    than a target's remainder (found by bisect on the remainder as a prefix). Results are cached per
    ``(targets, partial)``.
    """

    def __init__(self, pieces: Sequence[bytes | None]):
        self.vocab_size = len(pieces)
        self.by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(pieces):
            if b:  # special tokens (None) and empty tokens are never allowed in a body
                self.by_bytes.setdefault(b, []).append(i)
        self.ordered = sorted((b, i) for b, ids in self.by_bytes.items() for i in ids)
        self.keys = [b for b, _ in self.ordered]
        self.max_len = max((len(b) for b in self.by_bytes), default=0)
        self._cache: dict[tuple[tuple[bytes, ...], bytes], tuple[int, ...]] = {}

    def allowed(self, partial: bytes, targets: tuple[bytes, ...]) -> tuple[int, ...]:
        """Sorted ids ``s`` with ``partial + s`` a prefix of a target or a target a prefix of it.

        For each target ``T`` that extends ``partial``, with remainder ``R = T[len(partial):]``: the
        tokens equal to ``R[:j]`` (dict look-ups, ``j <= max token length``) and the tokens that
        start with ``R`` and are longer (bisect). Empty when no target extends ``partial``.
        """
        key = (targets, partial)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        out: set[int] = set()
        for t in targets:
            if not t.startswith(partial) or len(t) == len(partial):
                continue
            rest = t[len(partial) :]
            for j in range(1, min(len(rest), self.max_len) + 1):
                out.update(self.by_bytes.get(rest[:j], ()))
            if len(rest) < self.max_len:
                k = bisect.bisect_right(self.keys, rest)  # strictly longer tokens starting with rest
                while k < len(self.keys) and self.keys[k].startswith(rest):
                    out.add(self.ordered[k][1])
                    k += 1
        res = tuple(sorted(out))
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = res
        return res


# --------------------------------------------------------------------------------------------------
# Per-row decoding state


class SearchConstraint:
    """The constraint's state for one batch of rows being sampled.

    ``sources``: one source per row (the solution the row's edits apply to). Call :meth:`allowed`
    before sampling a step (the allowed ids per row, ``None`` where the row is unconstrained) and
    :meth:`advance` with the sampled ids after it.

    ``replace_name``: also constrain each REPLACE text to start with ``NAME =`` of the knob line its
    SEARCH text chose (each target then ends with ``b"NAME ="``, see :func:`targets_for`).
    ``values``: per row, the knob spaces as value sources (or None for a row without): the whole
    REPLACE text is then ``NAME = value`` with a value of the knob's space.
    """

    def __init__(
        self,
        index: TokenIndex,
        pieces: Sequence[bytes | None],
        sources: Sequence[str],
        start: str | None = None,
        end: str | None = None,
        replace_name: bool = False,
        values: Sequence[Mapping[str, Sequence[str]] | None] | None = None,
    ):
        self.index, self.pieces = index, pieces
        self.replace_name = replace_name
        self.sources = list(sources)
        self.values = list(values) if values is not None else [None] * len(self.sources)
        if len(self.values) != len(self.sources):
            raise ValueError(f"{len(self.values)} knob spaces for {len(self.sources)} sources")
        self.start, self.end = start, end
        self.text = [b"" for _ in self.sources]
        self.body: list[int | None] = [None] * len(self.sources)  # offset of the body in text
        self.targets: list[tuple[bytes, ...]] = [()] * len(self.sources)
        self.done = [False] * len(self.sources)

    def allowed(self) -> list[tuple[int, ...] | None]:
        """Per row: the allowed ids (non-empty) when the row is in a SEARCH body, else None."""
        out: list[tuple[int, ...] | None] = []
        for r, off in enumerate(self.body):
            ids = None
            if off is not None and not self.done[r]:
                ids = self.index.allowed(self.text[r][off:], self.targets[r]) or None
            out.append(ids)
        return out

    def advance(self, ids: Sequence[int], live: Sequence[bool]) -> None:
        """Append the sampled ids of the rows that were ``live`` (not finished) at this step; a row
        that is not live is done for good."""
        for r, (i, alive) in enumerate(zip(ids, live, strict=True)):
            if self.done[r] or not alive:
                self.done[r] = True
                continue
            piece = self.pieces[i] if 0 <= i < len(self.pieces) else None
            self.text[r] += piece or b""
            off = self.body[r]
            if off is not None:
                partial = self.text[r][off:]
                if any(partial.startswith(t) for t in self.targets[r]):
                    self.body[r] = None  # the divider was written: REPLACE text follows
                elif not any(t.startswith(partial) for t in self.targets[r]):
                    self.body[r] = None  # left the targets while unconstrained: give up on it
            if self.body[r] is None and self.text[r].endswith(HEAD):
                before = self.text[r][: -len(HEAD)].decode("utf-8", errors="replace")
                targets = block_targets(
                    self.sources[r], before, self.start, self.end, self.replace_name, self.values[r]
                )
                if targets:
                    self.body[r], self.targets[r] = len(self.text[r]), targets


# --------------------------------------------------------------------------------------------------
# Tensors and masked log-probs


def pad_allowed(
    steps: Sequence[Sequence[tuple[int, ...] | None]], n_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps[t][r]``: row r's allowed ids at step t (or None) -> ``allowed [N, T, K]`` long padded
    with -1 (``K >= 1``) and ``constrained [N, T]`` bool."""
    t_len = len(steps)
    k = max((len(a) for s in steps for a in s if a), default=1)
    allowed = torch.full((n_rows, t_len, k), -1, dtype=torch.long)
    constrained = torch.zeros((n_rows, t_len), dtype=torch.bool)
    for t, step in enumerate(steps):
        if len(step) != n_rows:
            raise ValueError(f"step {t} has {len(step)} rows, expected {n_rows}")
        for r, a in enumerate(step):
            if a:
                allowed[r, t, : len(a)] = torch.tensor(a, dtype=torch.long)
                constrained[r, t] = True
    return allowed, constrained


def masked_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits [B, V]`` with every id outside ``allowed [B, K]`` (-1 padded) set to -inf (a row
    whose ``allowed`` is all -1 is returned unchanged). For sampling one step."""
    valid = allowed >= 0
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, allowed.clamp(min=0), valid)
    keep |= ~valid.any(-1, keepdim=True)
    return logits.masked_fill(~keep, float("-inf"))


def masked_token_log_probs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    allowed: torch.Tensor | None = None,
    constrained: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probs ``[N, T]`` of ``tokens [N, T]`` under ``softmax(logits)`` (``logits [N, T, V]``,
    already temperature-scaled), renormalised over ``allowed [N, T, K]`` where ``constrained
    [N, T]``: ``logit[token] - logsumexp(logit[allowed])`` (gather over the K ids, never a dense
    ``[N, T, V]`` mask). Differentiable; the sampler calls it with ``T = 1``."""
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    if constrained is None or allowed is None or not bool(constrained.any()):
        return lp
    if allowed.shape[:2] != tokens.shape or constrained.shape != tokens.shape:
        raise ValueError(
            f"allowed {tuple(allowed.shape)} / constrained {tuple(constrained.shape)} do not match "
            f"tokens {tuple(tokens.shape)} (expected [N, T, K] and [N, T])"
        )
    pos = constrained.nonzero(as_tuple=True)
    z = logits[pos]  # [M, V]
    ids = allowed[pos]  # [M, K]
    za = z.gather(-1, ids.clamp(min=0)).masked_fill(ids < 0, float("-inf"))
    lpc = z.gather(-1, tokens[pos][:, None]).squeeze(-1) - torch.logsumexp(za, -1)
    return lp.index_put(pos, lpc)
