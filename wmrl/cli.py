"""`wmrl ...`: thin entry points over the library.

wmrl run PRESET [--out-dir DIR] [--grpo.group_size=8 --anchors.fraction=0.25 ...]
wmrl run --resume RUN_DIR
wmrl compare SPEC.yaml [--out-dir DIR] [--executor.type=ray --seeds=[0,1] ...]   # a grid: domain x method x seed
wmrl merge-reports A/report.json B/report.json --out-dir DIR   # one grid run in parts (disjoint seeds)
wmrl merge-reports A B --method-from ppi=C --out-dir DIR       # ... with ppi's cells from grid C (other overrides)
wmrl family FAMILY.yaml --out-dir DIR   # a confirmatory family over grids: Holm-adjusted verdicts
wmrl config PRESET [overrides]     # every field with its value and comment (also: wmrl run PRESET --help)
wmrl tasks DOMAIN
wmrl presets
wmrl export RUN_DIR --out-dir DIR [--adapter] [--push-to-hub REPO [--private] [--dry-run]]
wmrl status DIR [--json]           # where a run or a grid stands: each run's state, steps, scores, time left

Every bad input ends in one line on stderr, ``wmrl: error: ...``, exit status 2, and nothing
written before is touched.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from wmrl.config import (
    ConfigError,
    did_you_mean,
    load_config,
    load_domains,
    load_methods,
    presets,
)
from wmrl.config_messages import describe_config
from wmrl.extras import quiet_dataset_bars
from wmrl.signals import repeated_signal


def _epilog() -> str:
    return (
        f"methods: {', '.join(load_methods())}\n"
        f"presets: {', '.join(presets()) or '(none)'}\n"
        "config overrides: any field as --section.field=value, e.g. --method=real --grpo.group_size=8 "
        "--anchors.fraction=0.25 --executor.type=ray; the method's own settings as --method_config.*, e.g. "
        "--method=ppi --method_config.ppi.lam=0 (or, for every method that keeps ppi's tuner, --ppi.lam=0)\n"
        "every field of a preset with its value and comment: wmrl config PRESET (or wmrl run PRESET --help)"
    )


class _Parser(argparse.ArgumentParser):
    run_parser: argparse.ArgumentParser  # for `wmrl run PRESET --help`


def build_parser() -> _Parser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="wmrl",
        description="World-model RL post-training: GRPO with anchor groups, online debiasing and denoising.",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="train one run (methods compared over seeds: wmrl compare SPEC)",
        description="Train one run from a preset (a name in wmrl/configs/ or a YAML path) with optional "
        "overrides. A comparison of methods over seeds is a grid: wmrl compare SPEC.",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    parser.run_parser = run  # for `wmrl run PRESET --help`
    run.add_argument("preset", nargs="?", help="preset name or YAML file (see the list below)")
    run.add_argument("--out-dir", help="run directory (default: runs/<preset>)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    compare = sub.add_parser(
        "compare",
        help="a grid of runs (domain preset x method x seed) on local processes or Ray, one report",
        description="Run (or finish) the grid a spec declares (wmrl/grid.py: fields, layout, stages) and "
        "write report.md, report.html and report.json in DIR. Rerunning keeps finished cells, resumes "
        "killed ones and refuses cells whose config changed. Spec fields are overridable as "
        "--executor.type=ray --executor.ray_address=HOST:PORT --executor.workers=4 --seeds=[0,1] "
        "--reeval_episodes=20.",
        formatter_class=fmt,
    )
    compare.add_argument("spec", help="grid spec (YAML), e.g. benchmarks/specs/cross_domain_small.yaml")
    compare.add_argument("--out-dir", help="grid directory (default: runs/<spec name>)")
    merge = sub.add_parser(
        "merge-reports",
        help="one report from the reports of one grid run in parts (disjoint seeds)",
        description="Merge the report.json files of one grid (same spec, domains and methods) whose "
        "seeds ran in separate grid directories, e.g. on separate machines, into one report over all "
        "the seeds: every mean, standard error and paired difference is recomputed from the cells.",
        formatter_class=fmt,
    )
    merge.add_argument("reports", nargs="+", help="report.json files (or the grid directories holding them)")
    merge.add_argument("--out-dir", required=True, help="where the merged report.{json,md,png,html} go")
    merge.add_argument(
        "--method-from",
        action="append",
        default=[],
        metavar="METHOD=REPORT",
        help="take every cell of METHOD from REPORT, a grid that ran it with other overrides on the same "
        "preset and re-evaluation (e.g. --method-from ppi=runs/grid-ppi-gradient); repeatable",
    )
    family = sub.add_parser(
        "family",
        help="a confirmatory family over grids: each comparison's p, Holm-adjusted p and verdict",
        description="Read the grids a family declares (FAMILY.yaml: its methods, baseline and each "
        "grid's spec and report.json) and write family.md and family.json: per comparison the paired "
        "difference to the baseline, its one-sided p and Holm-adjusted p (superiority and "
        "non-inferiority at the domain's margin), whether it clears its controls, a verdict (withheld "
        "until every seed the grid's spec fixed has finished; a grid with no report yet counts as not "
        "run, and while any comparison is unfinished Holm counts it at p = 1, so a verdict given stands) "
        "and a combined estimate per method.",
        formatter_class=fmt,
    )
    family.add_argument("spec", metavar="FAMILY.yaml", help="the family's declaration (wmrl/family.py)")
    family.add_argument("--out-dir", required=True, help="where family.md and family.json go")
    status = sub.add_parser(
        "status",
        help="where a run or a grid stands: each run's state, steps, scores and time left",
        description="Read a run or grid directory (nothing is written) and print, for each run, its state "
        "(running while a process holds the directory, stopped with a checkpoint to resume, finished, "
        "...), its steps out of grpo.steps, its latest in-run and final held-out scores, its training "
        "time and, for a running one, the time its remaining steps take at its recent pace.",
        formatter_class=fmt,
    )
    status.add_argument(
        "dir", metavar="DIR", help="a run directory (wmrl run) or a grid directory (wmrl compare)"
    )
    status.add_argument("--json", action="store_true", help="print the figures as JSON")
    archive = sub.add_parser(
        "archive",
        help="copy a grid's results without its checkpoints (to commit them); wmrl compare resumes from it",
        description="Copy GRID_DIR's finished cells, reports, ledger and recorded starts to DIR, leaving out "
        "unfinished cells, checkpoints, lock files and any file over --max-mb (listed). Copied back as a "
        "grid directory, `wmrl compare SPEC --out-dir COPY` keeps the finished cells and runs the rest "
        "(wmrl/grid_archive.py).",
        formatter_class=fmt,
    )
    archive.add_argument("grid_dir", metavar="GRID_DIR", help="a grid directory (wmrl compare)")
    archive.add_argument(
        "--out-dir", required=True, metavar="DIR", help="where the archive goes (updated in place)"
    )
    archive.add_argument(
        "--max-mb", type=float, default=5.0, help="leave out files larger than this (default 5)"
    )
    config = sub.add_parser(
        "config",
        help="print every config field of a preset with its value and comment (as a YAML preset)",
        description="Print the configuration that `wmrl run PRESET [overrides]` would use: every field "
        "with its value, the comment that documents it and its default where the value differs. The "
        "output is itself a valid preset.",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    config.add_argument("preset", help="preset name or YAML file")
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
    export.add_argument("--out-dir", required=True, metavar="DIR", help="a new or empty directory")
    export.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA research agents: write the peft adapter, not merged weights",
    )
    export.add_argument("--push-to-hub", metavar="REPO", help="then upload DIR to this Hub model repo")
    export.add_argument(
        "--private", action="store_true", help="with --push-to-hub: create the Hub repo as private"
    )
    export.add_argument(
        "--dry-run",
        action="store_true",
        help="with --push-to-hub: list what would be uploaded, upload nothing",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_dataset_bars()  # for the whole command (wmrl/extras.py)
    _log_warnings_as_lines()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    help_flags = {"-h", "--help"}
    if argv[:1] == ["run"] and help_flags & set(argv):
        args, overrides = parser.parse_known_args([a for a in argv if a not in help_flags])
        if args.preset:  # `wmrl run PRESET --help`: the command's help, then the preset's fields
            print(parser.run_parser.format_help())
            argv = ["config", args.preset, *overrides]
    args, overrides = parser.parse_known_args(argv)
    empty = getattr(args, "out_dir", None) is not None and not args.out_dir.strip()
    if empty:  # `--out-dir=` (an unset variable) must not fall back to the preset's directory
        print(f"wmrl: error: --out-dir is empty: give the {args.command} directory", file=sys.stderr)
        return 2
    previous_term = signal.getsignal(signal.SIGTERM)
    if args.command == "run":  # SIGTERM as Ctrl-C outside training too (a grid keeps its own handling)
        signal.signal(signal.SIGTERM, _stop_at_once)
    try:
        if args.command == "presets":
            for name, path in presets().items():
                print(f"{name}\t{path}")
        elif args.command == "tasks":
            _tasks(args.domain)
        elif args.command == "config":
            print(describe_config(load_config(args.preset, overrides)), end="")
        elif args.command == "run":
            _run(args, overrides)
        elif args.command == "compare":
            _compare(args, overrides, argv)
        elif args.command == "merge-reports":
            if overrides:
                raise ConfigError(f"wmrl merge-reports takes no overrides: {' '.join(overrides)}")
            _merge_reports(args, argv)
        elif args.command == "family":
            if overrides:
                raise ConfigError(f"wmrl family takes no overrides: {' '.join(overrides)}")
            from wmrl.family import write_family

            fam = write_family(args.spec, args.out_dir)
            for r in (r for r in fam["comparisons"] if r["not_run"]):
                print(f"family: no {r['grid']} yet: `{r['method']}` there counts as not run (p = 1 in Holm)")
            print(f"family: {args.out_dir}/family.md  {args.out_dir}/family.json")
        elif args.command == "status":
            if overrides:
                raise ConfigError(f"wmrl status takes no overrides: {' '.join(overrides)}")
            _status(args)
        elif args.command == "archive":
            if overrides:
                raise ConfigError(f"wmrl archive takes no overrides: {' '.join(overrides)}")
            _archive(args)
        elif args.command == "export":
            if overrides:
                raise ConfigError(f"wmrl export takes no overrides: {' '.join(overrides)}")
            try:
                _export(args)
            except (OSError, ValueError) as e:  # e.g. offline push, a run whose domain cannot export
                raise ConfigError(f"export failed: {e}") from e
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM: wmrl.tracking.RunInterrupted from training
        signum = getattr(e, "signum", signal.SIGINT)
        if hasattr(e, "describe"):
            print(f"wmrl: {e.describe(_resume_command(args, argv))}", file=sys.stderr)
        else:  # outside the training loop (building the domain, writing a report)
            print(
                f"wmrl: stopped by {signal.Signals(signum).name} outside a training step; "
                f"`{_resume_command(args, argv)}` continues from the last checkpoint (from step 0 "
                "where none was saved)",
                file=sys.stderr,
            )
        return 128 + signum
    except (ConfigError, RuntimeError, FileNotFoundError) as e:
        print(f"wmrl: error: {e}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    return 0


class _Stopped(KeyboardInterrupt):
    """SIGTERM outside the training loop: stop as on Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__()
        self.signum = signum


_first_stop: list[float] = []  # time.monotonic() of the SIGTERM that stopped the command


def _stop_at_once(signum: int, frame) -> None:
    """SIGTERM outside the training loop: stop, once. A copy arriving within
    ``wmrl.signals.SIGNAL_GRACE_S`` (``uv run`` forwards the SIGTERM its process group got) is the
    same signal and must not interrupt the stop's own message."""
    if _first_stop and not repeated_signal(_first_stop[0]):
        return
    _first_stop[:] = [time.monotonic()]
    raise _Stopped(signum)


def _resume_command(args: argparse.Namespace, argv: list[str]) -> str:
    """The command that continues what ``argv`` started: ``wmrl run --resume DIR`` for a run, the
    same command for anything else (a grid continues where it stopped)."""
    import shlex

    if args.command == "run":
        out_dir = args.resume or args.out_dir
        if out_dir is None and args.preset:
            out_dir = os.path.join("runs", os.path.splitext(os.path.basename(args.preset))[0])
        if out_dir is not None:
            return f"wmrl run --resume {shlex.quote(out_dir)}"
    return shlex.join(["wmrl", *argv])


class _StderrLines(logging.Handler):
    """Each record as one ``wmrl: warning: ...`` line on the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"wmrl: {record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


def _log_warnings_as_lines() -> None:
    """The library's warnings (``logging.getLogger("wmrl")``) as one line each on stderr."""
    logger = logging.getLogger("wmrl")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        logger.addHandler(_StderrLines(logging.WARNING))
        logger.propagate = False


def _tasks(domain: str) -> None:
    from wmrl.config import DomainConfig

    known = load_domains()
    if domain not in known:
        raise ConfigError(
            f"unknown domain {domain!r}{did_you_mean(domain, known)} (known: {', '.join(known)})"
        )
    for line in DomainConfig.get_choice_class(domain).task_lines():
        print(line)


def _run(args: argparse.Namespace, overrides: list[str]) -> None:
    from wmrl.runs import resume_run, train_run  # torch only once a run is built

    if args.resume:
        if args.preset or overrides:
            raise ConfigError("--resume RUN_DIR takes no preset or overrides: the run keeps its own config")
        result = resume_run(args.resume)
        from wmrl.distributed import writes_run_dir

        if writes_run_dir():
            print(_brief(result))
        return
    if not args.preset:
        raise ConfigError(f"wmrl run needs a preset; known presets: {', '.join(presets())}")
    if any(o.split("=")[0] in ("--out_dir", "--out-dir") for o in overrides):
        # the run directory is the command's --out-dir option: an --out_dir= override would be overruled
        raise ConfigError("set the run directory with --out-dir DIR, not as an --out_dir= override")
    out_dir = args.out_dir or os.path.join("runs", os.path.splitext(os.path.basename(args.preset))[0])
    cfg = load_config(args.preset, [*overrides, f"--out_dir={out_dir}"])
    last = train_run(cfg)
    from wmrl.distributed import writes_run_dir

    if writes_run_dir():  # data-parallel: the main process reports the run (its metrics)
        print(_brief(last))
        print(f"run directory: {out_dir}")


def _compare(args: argparse.Namespace, overrides: list[str], argv: list[str]) -> None:
    import shlex

    from wmrl.grid import load_spec, run_grid

    spec = load_spec(args.spec, overrides)
    out_dir = args.out_dir or os.path.join("runs", os.path.splitext(os.path.basename(args.spec))[0])
    run_grid(spec, out_dir, command=shlex.join(["wmrl", *argv]))


def _merge_reports(args: argparse.Namespace, argv: list[str]) -> None:
    import json
    import shlex
    from pathlib import Path

    from wmrl.report import merge_reports, write_report_files

    def read(arg: str) -> tuple[dict, str]:
        path = Path(arg) / "report.json" if Path(arg).is_dir() else Path(arg)
        try:
            return json.loads(path.read_text()), str(path)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read the report {path}: {e}") from e

    parts = [read(p) for p in args.reports]
    method_from = {}
    for given in args.method_from:
        method, sep, path = given.partition("=")
        if not sep or not method or not path:
            raise ConfigError(f"--method-from takes METHOD=REPORT, got {given!r}")
        if method in method_from:
            raise ConfigError(f"--method-from names {method} twice")
        method_from[method] = read(path)
    merged = merge_reports([r for r, _ in parts], [n for _, n in parts], method_from)
    write_report_files(Path(args.out_dir), merged, command=shlex.join(["wmrl", *argv]))
    print(f"merged report of seeds {merged['spec']['seeds']}: {Path(args.out_dir) / 'report.md'}")


def _status(args: argparse.Namespace) -> None:
    import json

    from wmrl.status import format_status, status

    report = status(args.dir)
    print(json.dumps(report, indent=2) if args.json else format_status(report))


def _archive(args: argparse.Namespace) -> None:
    from wmrl.grid_archive import archive_grid

    done = archive_grid(args.grid_dir, args.out_dir, max_bytes=int(args.max_mb * 2**20))
    print(f"archived {done['files']} files of {len(done['finished'])} finished cells to {args.out_dir}")
    for name, state in done["not_finished"].items():  # "killed": a checkpoint, the run stopped or running
        print(f"  not archived: {name} ({'in progress or stopped' if state == 'killed' else state})")
    for entry in done["left_out"]:
        print(f"  left out (over {args.max_mb:g} MB): {entry}")


def _export(args: argparse.Namespace) -> None:
    from wmrl.export import export_run, push_to_hub

    for flag in ("dry_run", "private"):
        if getattr(args, flag) and not args.push_to_hub:
            raise ConfigError(f"--{flag.replace('_', '-')} goes with --push-to-hub REPO")
    manifest = export_run(args.run_dir, args.out_dir, adapter=args.adapter)
    print(
        f"exported {manifest['domain']} run ({manifest['method']}, step {manifest['step']}) to {args.out_dir}"
    )
    print(f"  policy: {manifest['policy']['format']}")
    if manifest.get("world_model"):
        print(f"  world model: {manifest['world_model']['format']}")
    if args.push_to_hub:
        ops = push_to_hub(args.out_dir, args.push_to_hub, private=args.private or None, dry_run=args.dry_run)
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
