"""`wmrl ...`: thin entry points over the library.

wmrl run PRESET [--out-dir DIR] [--grpo.group_size=8 --anchors.fraction=0.25 ...]
wmrl run --resume RUN_DIR
wmrl tasks DOMAIN
wmrl presets
wmrl export RUN_DIR --out DIR [--adapter] [--push-to-hub REPO [--dry-run]]
"""

from __future__ import annotations

import argparse
import os
import sys

from wmrl.config import METHODS, ConfigError, load_config, load_domains, presets


def _epilog() -> str:
    return (
        f"methods: {', '.join(METHODS)}\n"
        f"presets: {', '.join(presets()) or '(none)'}\n"
        "config overrides: any field as --section.field=value, e.g. --method=real --grpo.group_size=8 "
        "--anchors.fraction=0.25 --executor.type=ray"
    )


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="wmrl",
        description="World-model RL post-training: GRPO with anchor groups, online debiasing and denoising.",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="train one run, or the preset's comparison of methods over seeds",
        description="Train from a preset (a name in configs/ or a YAML path) with optional overrides. "
        "A preset with compare.methods runs every method and seed and writes summary.json and a plot.",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    run.add_argument("preset", nargs="?", help="preset name or YAML file (see the list below)")
    run.add_argument("--out-dir", help="run directory (default: runs/<preset>)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    tasks = sub.add_parser(
        "tasks",
        help="print every registered task id of a domain, one per line",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    tasks.add_argument("domain", help=f"one of: {', '.join(load_domains())}")
    sub.add_parser("presets", help="print the named presets", epilog=_epilog(), formatter_class=fmt)
    export = sub.add_parser(
        "export",
        help="write a run's trained policy and world model as folders transformers / lerobot / "
        "huggingface_hub load, with a model card",
        description="Export RUN_DIR's last checkpoint to DIR (see wmrl/export.py for what each domain writes).",
    )
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory")
    export.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA research agents: write the peft adapter, not merged weights",
    )
    export.add_argument("--push-to-hub", metavar="REPO", help="then upload DIR to this Hub model repo")
    export.add_argument(
        "--dry-run",
        action="store_true",
        help="with --push-to-hub: list what would be uploaded, upload nothing",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    args, overrides = parser.parse_known_args(argv)
    try:
        if args.command == "presets":
            for name, path in presets().items():
                print(f"{name}\t{path}")
        elif args.command == "tasks":
            _tasks(args.domain)
        elif args.command == "run":
            _run(args, overrides)
        elif args.command == "export":
            if overrides:
                raise ConfigError(f"wmrl export takes no overrides: {' '.join(overrides)}")
            try:
                _export(args)
            except (OSError, ValueError) as e:  # e.g. offline push, a run whose domain cannot export
                raise ConfigError(f"{type(e).__name__}: {e}") from e
    except (ConfigError, RuntimeError, FileNotFoundError) as e:
        print(f"wmrl: error: {e}", file=sys.stderr)
        return 2
    return 0


def _tasks(domain: str) -> None:
    from wmrl.config import DomainConfig

    known = load_domains()
    if domain not in known:
        raise ConfigError(f"unknown domain {domain!r}; known domains: {', '.join(known)}")
    for line in DomainConfig.get_choice_class(domain).task_lines():
        print(line)


def _run(args: argparse.Namespace, overrides: list[str]) -> None:
    from wmrl.experiment import compare, format_table, resume_run, train_run

    if args.resume:
        if args.preset or overrides:
            raise ConfigError("--resume RUN_DIR takes no preset or overrides: the run keeps its own config")
        last = resume_run(args.resume)
        print(_brief(last))
        return
    if not args.preset:
        raise ConfigError(f"wmrl run needs a preset; known presets: {', '.join(presets())}")
    out_dir = args.out_dir or os.path.join("runs", os.path.splitext(os.path.basename(args.preset))[0])
    cfg = load_config(args.preset, [*overrides, f"--out_dir={out_dir}"])
    if cfg.compare.methods:
        summary = compare(cfg)
        print(format_table(summary))
        print(f"\nsummary: {out_dir}/summary.json   plot: {out_dir}/comparison.png")
    else:
        print(_brief(train_run(cfg)))
        print(f"run directory: {out_dir}")


def _export(args: argparse.Namespace) -> None:
    from wmrl.export import export_run, push_to_hub

    if args.dry_run and not args.push_to_hub:
        raise ConfigError("--dry-run goes with --push-to-hub REPO")
    manifest = export_run(args.run_dir, args.out, adapter=args.adapter)
    print(f"exported {manifest['domain']} run ({manifest['method']}, step {manifest['step']}) to {args.out}")
    print(f"  policy: {manifest['policy']['format']}")
    if manifest.get("world_model"):
        print(f"  world model: {manifest['world_model']['format']}")
    if args.push_to_hub:
        ops = push_to_hub(args.out, args.push_to_hub, dry_run=args.dry_run)
        verb = "would upload" if args.dry_run else "uploaded"
        print(f"{verb} {len(ops)} files to {args.push_to_hub}:")
        for op in ops:
            print(
                f"  {op.path_in_repo}  {op.upload_info.size} bytes  sha256 {op.upload_info.sha256.hex()[:12]}"
            )


def _brief(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.startswith(("eval/", "reward/", "exec/real_total", "denoise/w"))]
    return "  ".join(f"{k}={metrics[k]:.4g}" for k in keys)


if __name__ == "__main__":
    sys.exit(main())
