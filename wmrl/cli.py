"""`wmrl ...`: thin entry points over the library.

wmrl run PRESET [--out-dir DIR] [--grpo.group_size=8 --anchors.fraction=0.25 ...]
wmrl run --resume RUN_DIR
wmrl tasks DOMAIN
wmrl presets
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


def _brief(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.startswith(("eval/", "reward/", "exec/real_total", "denoise/w"))]
    return "  ".join(f"{k}={metrics[k]:.4g}" for k in keys)


if __name__ == "__main__":
    sys.exit(main())
