"""`wmrl export RUN_DIR --out-dir DIR`: a finished run's models as folders users load with their own tools.

The core knows no domain: it reads the run's ``config.yaml`` and last checkpoint (``weights_only``),
hands them to the domain config's ``export`` hook (see :class:`Exporter`), and writes what every
export shares: a model card (``README.md``: method, real executions, held-out figures, the run's
config) and ``wmrl_export.json`` (the same facts, machine-readable). ``--push-to-hub REPO`` uploads
``DIR`` through huggingface_hub; ``dry_run`` builds the very commit operations and uploads nothing.

What a domain writes (each loads without wmrl where a standard library exists):

- research: ``DIR`` is a transformers folder (``AutoModelForCausalLM.from_pretrained(DIR)``, LoRA
  merged) with its tokenizer, or with ``adapter=True`` the peft adapter of a LoRA run
  (``PeftModel.from_pretrained(base, DIR)``);
- VLA: the small VLA as ``model.safetensors`` + ``config.json`` (``SmallVLA.from_pretrained(DIR)``),
  or a lerobot-bridged policy as a lerobot policy folder (``ACTPolicy.from_pretrained(DIR)``);
- both: the world model under ``DIR/world_model`` as safetensors + config.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from wmrl.config import ConfigError, DomainConfig, load_config
from wmrl.domain import check_domain_config
from wmrl.methods import METHODS
from wmrl.tracking import CHECKPOINT, load_checkpoint, read_metrics

if TYPE_CHECKING:
    from huggingface_hub import CommitOperationAdd

    from wmrl.config import RunConfig

CARD = "README.md"
MANIFEST = "wmrl_export.json"


@runtime_checkable
class Exporter(Protocol):
    """A domain config that can export a run: ``cfg.domain.export(run, state, out, adapter=...)``, a
    hook it declares (:class:`wmrl.domain.DomainConfigCapabilities`, checked before it is called).

    ``state`` is the run's checkpoint (policy, domain state, ...); the hook writes the policy and the
    world model under ``out`` and returns a description for the model card:
    ``{"policy": {"format", "load", "files", ...}, "world_model": {...}, "tags": [...], "notes": [...]}``.
    """

    def export(self, run: RunConfig, state: dict, out: Path, adapter: bool = False) -> dict[str, Any]: ...


def export_run(run_dir: str | Path, out: str | Path, adapter: bool = False) -> dict[str, Any]:
    """Export the run in ``run_dir`` to ``out`` (a new or empty directory); returns the manifest."""
    run_dir, out = Path(run_dir), Path(out)
    runs = runs_under(run_dir)
    if not (run_dir / CHECKPOINT).exists() and runs:
        listed = ", ".join(str(r.relative_to(run_dir)) for r in runs[:4]) + (", ..." if len(runs) > 4 else "")
        raise ConfigError(
            f"{run_dir} is the root of a comparison ({len(runs)} runs: {listed}); export one of its "
            f"runs, e.g. wmrl export {runs[0]} --out-dir {out}"
        )
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    if not (run_dir / CHECKPOINT).exists():
        raise FileNotFoundError(f"{run_dir} holds no checkpoint ({CHECKPOINT}): nothing to export")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out-dir {out} is not empty; export into a new directory")
    cfg = load_config(run_dir / "config.yaml", [f"--out_dir={run_dir}"])
    domain = DomainConfig.get_choice_name(type(cfg.domain))
    declared = check_domain_config(cfg.domain)
    hook = declared.export
    if hook is None:
        raise ConfigError(f"domain {domain!r} has no export (its config class declares no `export` hook)")
    state = load_checkpoint(run_dir, cfg)
    out.mkdir(parents=True, exist_ok=True)
    written = hook(cfg, state, out, adapter=adapter)
    manifest = {
        "domain": domain,
        "method": cfg.method,
        "seed": cfg.seed,
        "step": int(state["step"]),
        "real_executions": int(state["real_executions"]),
        "training": training_facts(cfg),
        "figures": run_figures(run_dir),
        **written,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    card = model_card(manifest, (run_dir / "config.yaml").read_text(), declared.display_name)
    (out / CARD).write_text(card)
    return manifest


def runs_under(root: Path) -> list[Path]:
    """The run directories (holding a checkpoint) of a comparison (``root/<method>/seed<k>``) or a
    grid (``root/<domain>/<method>/seed<k>``) rooted at ``root``."""
    found = [*root.glob(f"*/seed*/{CHECKPOINT}"), *root.glob(f"*/*/seed*/{CHECKPOINT}")]
    return sorted(p.parent.parent for p in found)


def training_facts(cfg: RunConfig) -> dict[str, Any]:
    """How the run trained, for the model card (the whole config follows it there)."""
    g = cfg.grpo
    return {
        "steps": g.steps,
        "tasks_per_step": g.tasks_per_step,
        "group_size": g.group_size,
        "anchor_fraction": cfg.anchors.fraction,
        "optimizer": g.optimizer,
        "lr": g.lr,
        "kl_coef": g.kl_coef,
        "precision": cfg.precision,
    }


def run_figures(run_dir: Path) -> dict[str, float]:
    """The held-out evaluation (``eval/*``) and cost figures of the run's last logged evaluation, and
    of its first one (the starting policy), from ``summary.json`` and ``metrics.jsonl``."""
    rows = read_metrics(run_dir)
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    out: dict[str, float] = {}
    summary = run_dir / "summary.json"
    last = json.loads(summary.read_text()) if summary.exists() else (rows[-1] if rows else {})
    if evals and not any(k.startswith("eval/") for k in last):
        last = {**last, **evals[-1]}
    for k, v in last.items():
        if isinstance(v, int | float) and (
            k.startswith(("eval/", "domain/")) or k in ("exec/real_total", "time/elapsed")
        ):
            out[k] = float(v)
    if len(evals) > 1 and evals[0]["step"] == 0:
        out.update({f"start/{k}": float(v) for k, v in evals[0].items() if k.startswith("eval/")})
    return out


def _fmt(v: float) -> str:
    return "nan" if isinstance(v, float) and math.isnan(v) else f"{v:.4g}"


def model_card(m: dict[str, Any], config_yaml: str, domain_name: str | None = None) -> str:
    """README.md for the export folder: Hub metadata header, how to load, figures, the run's config.
    ``domain_name``: the domain's name for people (its config's ``DISPLAY_NAME``), else its type."""
    from huggingface_hub import ModelCard, ModelCardData

    pol = m.get("policy", {})
    method = METHODS.get(m["method"])  # None: a method this install does not register
    executes = method.executes if method else "anchors"
    data = ModelCardData(
        library_name=pol.get("library", "wmrl"),
        tags=sorted({"wmrl", "grpo", "world-model-rl", f"wmrl-{m['domain']}", *m.get("tags", [])}),
        base_model=pol.get("base_model"),
    )
    figs = m["figures"]
    held = {k: v for k, v in figs.items() if k.startswith("eval/") and not k.endswith("_train")}
    start = {k[len("start/") :]: v for k, v in figs.items() if k.startswith("start/")}
    lines = [
        f"# WMRL {domain_name or m['domain']} policy: method `{m['method']}`, seed {m['seed']}",
        "",
        f"Post-trained with WMRL GRPO (`wmrl run`, method `{m['method']}`) for "
        f"{m['step']} steps, with **{m['real_executions']} real executions** "
        f"({'every rollout group executed' if executes == 'all' else 'the other rollouts scored by a world model'}).",
        "",
        "## Method",
        "",
        f"`{m['method']}`: {method.summary if method else 'see the wmrl documentation'}.",
    ]
    if m.get("training"):
        t = m["training"]
        lines += [
            "",
            f"GRPO, {t['steps']} steps of {t['tasks_per_step']} tasks x {t['group_size']} rollouts; "
            + (f"anchor fraction {t['anchor_fraction']:g}; " if executes == "anchors" else "")
            + f"{t['optimizer']} lr {t['lr']:g}, KL coefficient {t['kl_coef']:g}; precision {t['precision']}.",
        ]
    lines += [
        "",
        "## Load it",
        "",
        "```python",
        pol.get("load", "# see wmrl_export.json"),
        "```",
        "",
    ]
    if m.get("world_model"):
        lines += [
            "World model (`world_model/`):",
            "",
            "```python",
            m["world_model"].get("load", ""),
            "```",
            "",
        ]
    lines += ["## Held-out evaluation (real execution)", ""]
    if held:
        lines += ["| figure | final | start of RL |", "|---|---|---|"]
        lines += [f"| `{k}` | {_fmt(v)} | {_fmt(start[k]) if k in start else ''} |" for k, v in held.items()]
    else:
        lines.append("The run logged no held-out evaluation.")
    cost = {k: v for k, v in figs.items() if k not in held and not k.startswith("start/")}
    if cost:
        lines += ["", "Cost: " + ", ".join(f"`{k}` = {_fmt(v)}" for k, v in cost.items())]
    for note in m.get("notes", []):
        lines += ["", note]
    lines += ["", "## Files", ""]
    for part in ("policy", "world_model"):
        for f in m.get(part, {}).get("files", []):
            lines.append(f"- `{f}` ({part})")
    lines += ["", "## The run's config (`config.yaml`)", "", "```yaml", config_yaml.rstrip(), "```", ""]
    card = ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n\n" + "\n".join(lines))
    return str(card)


def hub_operations(folder: str | Path) -> list[CommitOperationAdd]:
    """One huggingface_hub ``CommitOperationAdd`` per file under ``folder`` (sizes and sha256 computed)."""
    from huggingface_hub import CommitOperationAdd

    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return [
        CommitOperationAdd(path_in_repo=p.relative_to(folder).as_posix(), path_or_fileobj=str(p))
        for p in files
    ]


def push_to_hub(
    folder: str | Path,
    repo_id: str,
    private: bool | None = None,
    dry_run: bool = False,
    token: str | None = None,
) -> list[CommitOperationAdd]:
    """Upload an export folder as one commit of the model repo ``repo_id`` (created if missing).

    ``dry_run``: build the commit's operations (what would be uploaded, with sizes and sha256) and
    return them without contacting the Hub. Offline (``HF_HUB_OFFLINE=1``) a real push fails with
    huggingface_hub's own error.
    """
    from huggingface_hub import HfApi

    ops = hub_operations(folder)
    if not ops:
        raise FileNotFoundError(f"{folder} holds no files to upload")
    if dry_run:
        return ops
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    api.create_commit(repo_id, ops, commit_message="wmrl export", repo_type="model")
    return ops
