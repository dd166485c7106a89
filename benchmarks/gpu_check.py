"""GPU check: both domains' debug presets on a device, every model and learner batch checked on it.

For a user with a GPU (and for this project's machines when one is lent):

    uv run python benchmarks/gpu_check.py                    # --device=cuda, both domains
    uv run python benchmarks/gpu_check.py --device cuda:1 --domains vla
    uv run python benchmarks/gpu_check.py --device cpu       # the same checks on the CPU
    uv run python benchmarks/gpu_check.py --precision bf16   # policy and WM forward passes autocast

For each domain it builds the debug preset on ``--device`` (SFT, world-model pretraining there),
trains ``--steps`` GRPO steps with a KL reference, and checks that the policy, the reference, the
world model and the optimizer state live on the device and that every batch the learner gets is
there; then it times the same number of steps on the CPU from the same cached start
(``--no-cpu-baseline`` skips that). Writes JSON (``--out``) and prints one line per domain; exits 1
if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from sims._gl import select_backend  # noqa: E402

select_backend()  # MUJOCO_GL as `wmrl run` chooses it (EGL where no display and no choice of yours)

import torch  # noqa: E402

PRESETS = {"vla": "vla-debug", "research": "research-debug"}


def _devices(module: torch.nn.Module) -> set[str]:
    return {str(t.device) for t in [*module.parameters(), *module.buffers()]}


def run_domain(name: str, device: str, steps: int, cache: Path, work: Path, precision: str = "fp32") -> dict:
    import wmrl.trainer as trainer_mod
    from wmrl.config import load_config
    from wmrl.device import resolve_device
    from wmrl.trainer import Trainer

    cfg = load_config(
        PRESETS[name],
        [f"--out_dir={work / f'{name}-{device}'}", f"--domain.cache_dir={cache / name}", f"--device={device}",
         f"--grpo.steps={steps}", "--grpo.kl_coef=0.05", "--tracking.eval_every=0", f"--precision={precision}"],
    )  # fmt: skip
    want = str(resolve_device(cfg.device))
    t0 = time.perf_counter()
    domain = cfg.domain.build(cfg)
    build_s = time.perf_counter() - t0
    seen: list[set[str]] = []
    real = trainer_mod.grpo_update

    def recording(policy, optimizer, batch, adv, used, *args, **kwargs):
        seen.append({str(t.device) for t in [batch.tokens, batch.mask, adv, used, *batch.extras.values()]})
        return real(policy, optimizer, batch, adv, used, *args, **kwargs)

    trainer_mod.grpo_update = recording
    try:
        trainer = Trainer(cfg, domain)
        t0 = time.perf_counter()
        last = trainer.train()
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ev = trainer.evaluate()
        eval_s = time.perf_counter() - t0
    finally:
        trainer_mod.grpo_update = real
        close = getattr(domain, "close", None)
        if close is not None:
            close()
    wm = domain.world_model.model
    opt_devs = {
        str(v.device)
        for s in trainer.optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim()
    }
    checks = {
        "policy": _devices(domain.policy) == {want},
        "reference": trainer.reference is not None and _devices(trainer.reference) == {want},
        "world_model": _devices(wm) == {want},
        "optimizer_state": opt_devs == {want},
        "learner_batches": bool(seen) and all(s == {want} for s in seen),
    }
    return {
        "domain": name,
        "device": want,
        "precision": precision,
        "checks": checks,
        "ok": all(checks.values()),
        "build_s": build_s,
        "train_s_per_step": train_s / max(steps, 1),
        "eval_s": eval_s,
        "time_update_s": last.get("time/update"),
        "time_generate_s": last.get("time/generate"),
        "eval": {k: v for k, v in ev.items() if isinstance(v, float)},
        "cuda_max_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if want.startswith("cuda") else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--domains", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--no-cpu-baseline", action="store_true")
    p.add_argument("--out", default=None, help="JSON file for the results")
    a = p.parse_args(argv)
    from wmrl.device import DeviceError, resolve_device

    try:
        dev = resolve_device(a.device)
    except DeviceError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    print(
        f"torch {torch.__version__}, device {dev}"
        + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="wmrl-gpu-check-") as tmp:
        cache, work = Path(tmp) / "cache", Path(tmp) / "runs"
        for name in a.domains:
            r = run_domain(name, a.device, a.steps, cache, work, a.precision)
            if not a.no_cpu_baseline and dev.type != "cpu":
                cpu = run_domain(name, "cpu", a.steps, cache, work, "fp32")
                r["cpu_train_s_per_step"] = cpu["train_s_per_step"]
            results.append(r)
            bad = [k for k, v in r["checks"].items() if not v]
            print(
                f"{name}: {'OK' if r['ok'] else 'FAILED ' + ', '.join(bad)} on {r['device']}; "
                f"{r['train_s_per_step']:.2f} s/step"
                + (f" (CPU {r['cpu_train_s_per_step']:.2f})" if "cpu_train_s_per_step" in r else "")
                + f", build {r['build_s']:.1f} s, eval {r['eval_s']:.1f} s",
                flush=True,
            )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"device": str(dev), "results": results}, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
