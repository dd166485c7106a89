"""Peak memory of the research policy's two big operations at SmolLM2-135M's shape, per layer.

SmolLM2-135M-Instruct (hidden 576, 9 heads, 3 key-value heads, MLP 1536, vocabulary 49,152, 30
layers) is rebuilt from its config with random weights and fewer layers (``--layers``), so that one
case runs in seconds on a shared CPU; each case runs in a fresh subprocess and reports its peak
resident memory above the memory it held after building the model (``VmHWM - VmRSS``, Linux). The
slope over layers, times 30, is what the whole model needs; the intercept is what does not grow
with depth (the logits).

- ``train``: one SFT / GRPO update (``ResearchPolicy.completion_log_probs`` with gradients, LoRA on
  every linear layer, then backward) at ``--batch`` rows x ``--prompt`` prompt tokens +
  ``--completion`` completion tokens: ``plain``, with gradient checkpointing (``checkpointing``), and
  with it and ``lm.return_freed_memory`` (``checkpointing_mallopt``, what the pipeline does for
  every policy but tiny). Run it also under ``MALLOC_MMAP_THRESHOLD_=1048576`` to see how much of
  the peak is freed memory that glibc keeps (by default it serves blocks of up to 32 MB from its heap
  once a block that size has been freed, and keeps what is freed there).
- ``sample``: the first forward of ``ResearchPolicy.sample`` over ``--sample-batch`` prompts (the
  KV-cache fill), with every position's logits or only the last one's (``logits_to_keep=1``).

    uv run python benchmarks/research_policy_memory.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SMOLLM2 = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
FULL_LAYERS = 30


def _mem() -> dict[str, float]:
    """Current and peak resident memory of this process, MB (``/proc/self/status``)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0]) / 1024
    return out


def case(kind: str, layers: int, variant: str, args: argparse.Namespace) -> dict:
    """One measurement (runs in the subprocess)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **SMOLLM2))
    t0 = time.perf_counter()
    if kind == "train":
        from wmrl_research.lm import add_lora

        model = add_lora(model, r=8, alpha=16)
        if variant in ("checkpointing", "checkpointing_mallopt"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if variant == "checkpointing_mallopt":  # what the pipeline does for every policy but tiny
            from wmrl_research.lm import return_freed_memory

            assert return_freed_memory()
        model.train()
        n, p, t = args.batch, args.prompt, args.completion
        ids = torch.randint(0, SMOLLM2["vocab_size"], (n, p + t))
        base = _mem()["VmRSS"]
        logits = model(input_ids=ids, logits_to_keep=t + 1).logits  # as completion_log_probs
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, p:, None]).sum()
        (-lp).backward()
    else:
        model.eval()
        ids = torch.randint(0, SMOLLM2["vocab_size"], (args.sample_batch, args.prompt))
        base = _mem()["VmRSS"]
        with torch.no_grad():
            keep = {"logits_to_keep": 1} if variant == "last_logits" else {}
            out = model(input_ids=ids, use_cache=True, **keep)
            last = out.logits[:, -1]  # what the sampler reads
            assert last.shape == (args.sample_batch, SMOLLM2["vocab_size"])
    m = _mem()
    return {
        "kind": kind,
        "layers": layers,
        "variant": variant,
        "peak_above_model_mb": m["VmHWM"] - base,
        "model_rss_mb": base,
        "seconds": time.perf_counter() - t0,
    }


def fit(rows: list[dict], kind: str, variant: str) -> dict:
    """Least-squares ``peak = a + b * layers`` and the extrapolation to SmolLM2's 30 layers."""
    import numpy as np

    pts = [
        (r["layers"], r["peak_above_model_mb"]) for r in rows if (r["kind"], r["variant"]) == (kind, variant)
    ]
    x, y = np.array(pts, dtype=float).T
    b, a = np.polyfit(x, y, 1)
    return {
        "kind": kind,
        "variant": variant,
        "per_layer_mb": b,
        "intercept_mb": a,
        "at_30_layers_mb": a + b * FULL_LAYERS,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", type=int, default=[1, 3])
    ap.add_argument(
        "--batch", type=int, default=8, help="rows of the update (sft_batch_size, or a GRPO batch)"
    )
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (max_prompt_tokens)")
    ap.add_argument("--completion", type=int, default=128, help="completion tokens (max_new_tokens)")
    ap.add_argument("--sample-batch", type=int, default=16, help="prompts sampled at once")
    ap.add_argument(
        "--train-variants", nargs="+", default=["plain", "checkpointing", "checkpointing_mallopt"]
    )
    ap.add_argument("--kinds", nargs="+", default=["sample", "train"], choices=["sample", "train"])
    ap.add_argument("--out", default="runs/policy-memory")
    ap.add_argument("--case", nargs=3, metavar=("KIND", "LAYERS", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        kind, layers, variant = args.case
        print(json.dumps(case(kind, int(layers), variant, args)))
        return
    rows = []
    passthrough = [f"--batch={args.batch}", f"--prompt={args.prompt}", f"--completion={args.completion}",
                   f"--sample-batch={args.sample_batch}"]  # fmt: skip
    for kind, variants in (("sample", ("all_logits", "last_logits")), ("train", tuple(args.train_variants))):
        if kind not in args.kinds:
            continue
        for variant in variants:
            for layers in args.layers:
                cmd = [sys.executable, __file__, "--case", kind, str(layers), variant, *passthrough]
                res = json.loads(
                    subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
                )
                print(json.dumps(res), flush=True)
                rows.append(res)
    fits = [fit(rows, k, v) for k, v in {(r["kind"], r["variant"]) for r in rows}]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("case", "out")}
    settings["MALLOC_MMAP_THRESHOLD_"] = os.environ.get("MALLOC_MMAP_THRESHOLD_")  # glibc: see the docstring
    path = out / "research_policy_memory.json"
    path.write_text(json.dumps({"settings": settings, "cases": rows, "fits": fits}, indent=2))
    print(json.dumps(fits, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
