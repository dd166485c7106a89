"""Prepare the research domain: tokenizer -> policy + SFT -> execution log -> WM pretraining -> SFT eval.

Each stage is cached under ``<cache_dir>/<key>/`` where the key hashes the config fields the stage
depends on; a second build with the same fields loads everything (seconds). ``build_info.json`` in
that folder records the measured figures: SFT apply fraction, execution-log run fraction, WM
quality on held-out log executions, the SFT policy's held-out score.
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from wmrl.device import module_device, resolve_device
from wmrl.distributed import writes_run_dir
from wmrl.executors import make_executor
from wmrl.methods import method_of
from wmrl.tracking import OFFLINE_DATA, say, stage
from wmrl_research.cache_keys import cache_key as _key
from wmrl_research.cache_keys import data_key as _data_key
from wmrl_research.code_edits import sample_code_edit
from wmrl_research.config import DEFAULT_TASKS
from wmrl_research.domain import (
    ResearchDomain,
    ResearchWorldModel,
    solution_text,
    task_text,
    wm_example,
)
from wmrl_research.edits import (
    sample_knob_edit,
    synthetic_task,
)
from wmrl_research.execution_logs import (
    build_execution_log,
    build_random_log,
    log_name,
    random_info,
    random_log_path,
)
from wmrl_research.lm import add_lora, build_tokenizer, load_lm, return_freed_memory
from wmrl_research.policy import ResearchPolicy
from wmrl_research.prompts import build_prompt
from wmrl_research.sft import SFTConfig, edit_validity, run_sft
from wmrl_research.tasks import FAILURE_SCORE, list_tasks
from wmrl_research.wm_kinds import lm_size, wm_kind
from world_models.outcome import ExecutionLog, outcome_metrics

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl_research.config import ResearchConfig

log = logging.getLogger(__name__)
WM_ANSWER_TEMPLATE = " runs: yes; valid: no; quality: 0 1 2 3 4 5 6 7 8 9"
SYNTHETIC_TOKENIZER_TASKS = 400


def _say(run: RunConfig, msg: str) -> None:
    say(f"[research] {msg}", run.tracking.progress)


def _stage(run: RunConfig, msg: str):
    """A long build stage with its elapsed time on stderr (``tracking.progress``)."""
    return stage(f"[research] {msg}", run.tracking.progress)


def select_tasks(cfg: ResearchConfig) -> tuple[list[Any], list[Any]]:
    """(train tasks, held-out tasks): ``cfg.train_tasks`` (null: the whole train split) and
    ``cfg.heldout_tasks`` (null: the held-out split's tasks of the train tasks' cost tiers). The
    config has checked the ids and their splits (``ResearchConfig._check_tasks``)."""
    known = {t.id: t for t in list_tasks()}
    train = [known[t] for t in cfg.train_tasks] if cfg.train_tasks is not None else list_tasks("train")
    if cfg.heldout_tasks is not None:
        heldout = [known[t] for t in cfg.heldout_tasks]
    else:
        tiers = {t.tier for t in train}
        heldout = [t for t in list_tasks("heldout") if t.tier in tiers]
    return train, heldout


def _policy_fields(cfg: ResearchConfig, run: RunConfig, train: list[Any]) -> dict[str, Any]:
    return {
        "policy": cfg.policy,
        "tiny": (cfg.tiny_hidden, cfg.tiny_layers, cfg.vocab_size)
        + ((cfg.pretokenizer,) if cfg.pretokenizer != "bytelevel" else ()),
        "lora": (cfg.lora, cfg.lora_rank),
        "mode": (cfg.edit_mode, cfg.prompt_style),
        "sft": (cfg.sft_steps, cfg.sft_batch_size, cfg.sft_lr)
        + ((True,) if cfg.sft_include_heldout else ())
        + ((("synthetic", cfg.sft_synthetic),) if cfg.sft_synthetic else ())
        + ((("randomise", cfg.sft_randomise),) if cfg.sft_randomise else ())
        + ((("max_prompt_tokens", cfg.max_prompt_tokens),) if cfg.max_prompt_tokens != 512 else ()),
        "tasks": [t.id for t in train],
        "seed": run.seed,
        "v": 2,  # 2: the tokenizer never reads held-out text
    }


def constrained(cfg: ResearchConfig) -> bool:
    """Whether the policy decodes SEARCH texts under the knob-line constraint (knobs mode only)."""
    return cfg.search_constraint and cfg.edit_mode == "knobs"


def _decoding_key(cfg: ResearchConfig) -> list[Any]:
    """Cache-key fields of the stages whose outputs depend on how the policy decodes (the execution
    log, the WM pretrained on it, the held-out evaluation; never SFT): empty without the constraint,
    so the keys of unconstrained runs stay what they were."""
    if not constrained(cfg):
        return []
    if cfg.search_constraint_values:
        return [["search_constraint", "values"]]
    return [["search_constraint", "replace"]] if cfg.search_constraint_replace else [["search_constraint"]]


def tokenizer_corpus(tasks: list[Any], seed: int, synthetic: bool = False, free: bool = False) -> list[str]:
    """The tiny tokenizer's training text: prompts, random knob edits and WM prompts of ``tasks``
    (plus synthetic tasks' with ``synthetic``, and random free-form code edits with ``free``) and
    the structured WM answer."""
    rng = random.Random(seed)
    corpus: list[str] = []
    for t in tasks:
        corpus += [build_prompt(t, t.baseline_source, "knobs", "short")] * 4
        corpus += [
            build_prompt(t, t.baseline_source, "knobs"),
            build_prompt(t, t.baseline_source, "free"),
        ]
        corpus += [sample_knob_edit(t.baseline_source, t.knob_space, rng) for _ in range(20)]
        corpus += [f"Task: {task_text(t)}\nSolution:\n{solution_text(t, t.baseline_source)}\nOutcome:"]
        if free:
            corpus += [sample_code_edit(t.baseline_source, rng, 2, t.knob_space) for _ in range(20)]
    if synthetic:
        for _ in range(SYNTHETIC_TOKENIZER_TASKS):
            s = synthetic_task(rng)
            corpus += [
                build_prompt(s, s.baseline_source, "knobs", "short"),
                sample_knob_edit(s.baseline_source, s.knob_space, rng),
            ]
    corpus += [WM_ANSWER_TEMPLATE] * 8
    return corpus


def policy_cache(cfg: ResearchConfig, run: RunConfig) -> Path:
    """The folder of the policy's cached stages (tokenizer, SFT checkpoint, execution log, WM)."""
    train, _ = select_tasks(cfg)
    return Path(cfg.cache_dir) / _key(_policy_fields(cfg, run, train))


def untrained_policy(
    cfg: ResearchConfig, run: RunConfig, train: list[Any], heldout: list[Any], cache: Path
) -> ResearchPolicy:
    """The policy before SFT: tokenizer (trained once, cached under ``cache/tokenizer``), model, LoRA."""
    # Never held-out text (unless asked to): the tokenizer and SFT are both part of the policy.
    sft_tasks = train + (heldout if cfg.sft_include_heldout else [])
    tokenizer = None
    if cfg.policy == "tiny":
        corpus = tokenizer_corpus(sft_tasks, run.seed, cfg.sft_synthetic > 0, cfg.edit_mode == "free")
        tokenizer = build_tokenizer(corpus, cfg.vocab_size, cache / "tokenizer", cfg.pretokenizer)
    model, tokenizer = load_lm(
        cfg.policy,
        tokenizer,
        Path(cfg.cache_dir),
        seed=run.seed,
        **lm_size(cfg),
    )
    checkpointing = cfg.gradient_checkpointing
    wanted = checkpointing if checkpointing is not None else cfg.policy != "tiny"
    if wanted and getattr(model, "supports_gradient_checkpointing", False):
        # recompute each layer in backward (training mode only; sampling is unchanged), and return
        # freed activations to the system: without both, SmolLM2's update held ~13 GB of RSS
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return_freed_memory()
    if cfg.lora:
        model = add_lora(model, r=cfg.lora_rank, alpha=2 * cfg.lora_rank)
    return ResearchPolicy(
        model,
        tokenizer,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        search_constraint=constrained(cfg),
        constrain_replace=cfg.search_constraint_replace,
        constrain_values=cfg.search_constraint_values,
    )


def build_policy(
    cfg: ResearchConfig,
    run: RunConfig,
    train: list[Any],
    heldout: list[Any],
    cache: Path,
    accelerator=None,
):
    """The policy after SFT (cached ``policy.pt``), and the SFT edit-validity figures.

    With an ``accelerator`` (every process of a data-parallel run calls this): the main process
    trains the tokenizer first, SFT runs data-parallel (:func:`wmrl_research.sft.run_sft`), and the
    main process alone measures the validity figures and writes the cache, which the others read."""
    sft_tasks = train + (heldout if cfg.sft_include_heldout else [])
    # SFT and its validity figures below are unconstrained (sample() gets no sources there)
    if accelerator is None:
        policy = untrained_policy(cfg, run, train, heldout, cache)
    else:
        with accelerator.main_process_first():  # the tokenizer is trained once and cached
            policy = untrained_policy(cfg, run, train, heldout, cache)
    policy = policy.to(resolve_device(run.device))
    path = cache / "policy.pt"
    info_path = cache / "sft.json"
    if path.exists() and info_path.exists():
        policy.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return policy, json.loads(info_path.read_text())
    info: dict[str, Any] = {"params": policy.n_params(), "trainable_params": policy.n_params(True)}
    if cfg.sft_steps > 0:
        t0 = time.perf_counter()
        what = (
            f"SFT: {cfg.sft_steps} steps on {len(sft_tasks)} tasks"
            + (f" + {cfg.sft_synthetic:.0%} synthetic" if cfg.sft_synthetic else "")
            + f" ({info['trainable_params']} trainable params)"
        )
        with _stage(run, what):
            losses = run_sft(
                policy,
                sft_tasks,
                SFTConfig(
                    cfg.sft_steps,
                    cfg.sft_batch_size,
                    cfg.sft_lr,
                    seed=run.seed,
                    prompt_style=cfg.prompt_style,
                    synthetic_fraction=cfg.sft_synthetic,
                    randomise_fraction=cfg.sft_randomise,
                    mode=cfg.edit_mode,
                    max_prompt_tokens=cfg.max_prompt_tokens,
                ),
                accelerator,
            )
        info.update(
            {
                "sft_seconds": time.perf_counter() - t0,
                "sft_loss_first": losses[0],
                "sft_loss_last": losses[-1],
            }
        )
    if accelerator is not None and not accelerator.is_main_process:
        accelerator.wait_for_everyone()  # the main process measures and writes the cache
        return policy, json.loads(info_path.read_text())
    gen = torch.Generator().manual_seed(run.seed + 7)
    info["temperature"] = policy.temperature  # of the validity samples below
    with _stage(run, "SFT: sampling edits to measure how many apply"):
        for name, tasks in (("validity_train", train), ("validity_heldout", heldout)):
            info[name] = edit_validity(
                policy, tasks, 8, gen, cfg.edit_mode, cfg.prompt_style, cfg.max_prompt_tokens
            )
    _say(run, f"SFT edits apply: train {info['validity_train']['apply_fraction']:.2f}, "
         f"held-out {info['validity_heldout']['apply_fraction']:.2f}")  # fmt: skip
    torch.save({k: v.cpu() for k, v in policy.state_dict().items()}, path)
    info_path.write_text(json.dumps(info, indent=2))
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return policy, info


def sft_data_parallel(cfg: ResearchConfig, run: RunConfig, accelerator) -> None:
    """The SFT stage on every process of a data-parallel run (``wmrl run`` with N processes calls
    this before the domain is built; the build then reads the cached SFT policy)."""
    train, heldout = select_tasks(cfg)
    cache = policy_cache(cfg, run)
    if accelerator.is_main_process:
        cache.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    build_policy(cfg, run, train, heldout, cache, accelerator)


def build_world_model(
    cfg: ResearchConfig, run: RunConfig, tokenizer: Any = None, device: torch.device | str = "cpu"
):
    """The outcome WM named by ``cfg.world_model`` (its registered kind, :mod:`wmrl_research.wm_kinds`),
    untrained; the text kinds read with ``tokenizer`` (the policy's) and sit on ``device`` (the
    policy's; the knob surrogate is scikit-learn's)."""
    return wm_kind(cfg).build(run, tokenizer, device)


def log_paths(cfg: ResearchConfig, run: RunConfig, train: list[Any]) -> tuple[Path, Path]:
    """The cached SFT-sample execution log and the random-edit log of this config."""
    cache = Path(cfg.cache_dir) / _key(_policy_fields(cfg, run, train))
    sft_log = (
        cache
        / f"execution_log-{_key([cfg.log_samples_per_task, cfg.max_new_tokens, cfg.temperature, *_decoding_key(cfg), *_data_key()])}.jsonl"
    )
    return sft_log, random_log_path(cfg, train)


def _wm_input_key(cfg: ResearchConfig) -> list[Any]:
    # Empty for the default input, so the WMs cached before the option existed stay valid.
    return [] if cfg.wm_input == "view" else [f"wm_input={cfg.wm_input}"]


def pretrain_world_model(
    cfg: ResearchConfig, run: RunConfig, wm, examples: list, cache: Path, log_name: str = ""
) -> dict[str, Any]:
    """Fit on the log minus a random holdout, measure on the holdout, then add the holdout.

    ``log_name`` (the execution log's file name) is part of the cache key: a WM pretrained on one log
    is never reused for another (e.g. after a change of ``log_samples_per_task``)."""
    path = (
        cache
        / f"wm-{cfg.world_model}-{_key([cfg.wm_members, cfg.wm_dim, cfg.wm_lm_samples, cfg.wm_batch_size, cfg.wm_lr, cfg.wm_pretrain_steps, cfg.wm_holdout, 2, *_decoding_key(cfg), *_wm_input_key(cfg), log_name])}.pt"
    )
    info_path = path.with_suffix(".json")
    if path.exists() and info_path.exists():
        wm.load_state_dict_full(torch.load(path, map_location="cpu", weights_only=True))
        return json.loads(info_path.read_text())
    tasks = {t.id: t for t in list_tasks()}
    examples = [wm_example(tasks[e.task_id], e, cfg.wm_input) for e in examples]
    rng = random.Random(run.seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    n_hold = int(round(cfg.wm_holdout * len(examples)))
    hold = [examples[i] for i in order[:n_hold]]
    fit = [examples[i] for i in order[n_hold:]]
    t0 = time.perf_counter()
    what = f"WM ({cfg.world_model}): pretraining {cfg.wm_pretrain_steps} steps on {len(fit)} executions"
    with _stage(run, what):
        stats = wm.fit(fit, cfg.wm_pretrain_steps)
    info: dict[str, Any] = {
        "fit_seconds": time.perf_counter() - t0,
        **stats,
        "n_fit": len(fit),
        "n_holdout": len(hold),
    }
    if len(hold) >= 2:
        t1 = time.perf_counter()
        mean, var = wm.predict([e.task_text for e in hold], [e.solution_text for e in hold])
        info["predict_per_s"] = len(hold) / (time.perf_counter() - t1)
        y = torch.tensor([e.reward for e in hold])
        info["holdout"] = outcome_metrics(mean, var, y)
        _say(run, f"WM held-out: {json.dumps({k: round(v, 3) for k, v in info['holdout'].items()})}")
        if hasattr(wm, "calibrate_variance"):
            # Fitted and measured on the same holdout: an in-sample check of the variance scale.
            info["var_scale"] = wm.calibrate_variance(hold)
            m2, v2 = wm.predict([e.task_text for e in hold], [e.solution_text for e in hold])
            info["holdout_var_scaled"] = outcome_metrics(m2, v2, y)
        wm.update(hold, max(1, cfg.wm_pretrain_steps // 10))
    torch.save(wm.state_dict_full(), path)
    info_path.write_text(json.dumps(info, indent=2))
    return info


def prior_anchor_groups(
    cfg: ResearchConfig,
    run: RunConfig,
    sft_examples: list,
    random_examples: list,
    cache: Path,
    log_name: str,
    tokenizer: Any = None,
    device: torch.device | str = "cpu",
    folds: int = 4,
) -> list[tuple[list[float], list[float]]]:
    """The SFT-sample execution log as anchor groups for ``ppi``'s ``λ`` (``ppi.prior_from_log``):
    per group ``(raw WM scores, true rewards)`` of ``run.grpo.group_size`` of one train task's logged
    SFT samples (in log order; the baselines left out), each score predicted out of fold by a WM of
    the configured kind fitted on the random-edit log and the other folds' samples, as a run's own
    anchors are scored by a WM that has not seen them. These are the step-0 policy's samples executed
    before training, independent of every step's anchor draw, so ``λ`` estimated from them keeps the
    estimator unbiased (wmrl/ppi.py). The folds' WMs are weaker than the run's (they miss a fold),
    so the ``λ`` they give errs low. Cached beside the pretrained WM; costs ``folds`` WM fits."""
    key = [cfg.world_model, cfg.wm_members, cfg.wm_pretrain_steps, *_wm_input_key(cfg), log_name]
    path = cache / f"prior_groups-{_key([*key, run.grpo.group_size, folds, run.seed])}.json"
    if path.exists():
        return [tuple(g) for g in json.loads(path.read_text())]
    tasks = {t.id: t for t in list_tasks()}
    baselines = {solution_text(t, t.baseline_source) for t in tasks.values()}
    samples = [
        wm_example(tasks[e.task_id], e, cfg.wm_input)
        for e in sft_examples
        if e.solution_text not in baselines
    ]
    randoms = [wm_example(tasks[e.task_id], e, cfg.wm_input) for e in random_examples]
    order = list(range(len(samples)))
    random.Random(run.seed + 5).shuffle(order)
    fold_of = {i: k % folds for k, i in enumerate(order)}
    r_hat = [float("nan")] * len(samples)
    what = f"[research] ppi prior: out-of-fold WM fits on {len(samples)} SFT-sample executions"
    for f in tqdm(range(folds), desc=what, file=sys.stderr, disable=not run.tracking.progress):
        held = [i for i in range(len(samples)) if fold_of[i] == f]
        if not held:
            continue
        wm = build_world_model(cfg, run, tokenizer, device)
        wm.fit(randoms + [samples[i] for i in range(len(samples)) if fold_of[i] != f], cfg.wm_pretrain_steps)
        mean, _ = wm.predict([samples[i].task_text for i in held], [samples[i].solution_text for i in held])
        for i, m in zip(held, mean.tolist(), strict=True):
            r_hat[i] = m
    groups: list[tuple[list[float], list[float]]] = []
    for task_id in dict.fromkeys(e.task_id for e in samples):
        rows = [i for i, e in enumerate(samples) if e.task_id == task_id]
        for k in range(0, len(rows) - 1, run.grpo.group_size):
            chunk = rows[k : k + run.grpo.group_size]
            if len(chunk) >= 2:
                groups.append(([r_hat[i] for i in chunk], [samples[i].reward for i in chunk]))
    path.write_text(json.dumps(groups))
    return groups


def unset_task_notes(cfg: ResearchConfig, train: list[Any], heldout: list[Any]) -> list[str]:
    """One line per task list left unset (null), saying which tasks it stands for: a run says so
    when it starts, since the whole train split includes the heavy tier."""
    notes = []
    for name, chosen in (("train_tasks", train), ("heldout_tasks", heldout)):
        if getattr(cfg, name) is None:
            heavy = sum(t.tier == "heavy" for t in chosen)
            notes.append(
                f"domain.{name} is unset: using {DEFAULT_TASKS[name]}: {len(chosen)} tasks, {heavy} of "
                f"them heavy ({', '.join(t.id for t in chosen)}); list task ids to choose"
            )
    return notes


class TaskGradingError(RuntimeError):
    """A task none of whose rollouts could be graded (its baseline or reference fails)."""


def check_tasks_grade(run: RunConfig, tasks: list[Any], executor) -> None:
    """Measure each task's baseline and reference on this data build (``grading.calibrate``, cached
    after the first time) through ``executor``, before anything is trained: a task whose baseline
    or reference fails would leave every one of its rollouts ungraded, so the run stops here with
    one line naming the task and the solution's error."""
    from wmrl.domain import Job
    from wmrl_research.grading import calibrate

    timeout_s = run.executor.timeout_s
    _say(run, f"measuring the baseline and reference of {len(tasks)} tasks on this data build")
    results = executor.run([Job(fn=calibrate, args=(t.id,)) for t in tasks])
    for task, r in zip(tasks, results, strict=True):
        if r.status == "timeout":
            raise TaskGradingError(
                f"task {task.id}: measuring its baseline and reference took longer than "
                f"executor.timeout_s={timeout_s:g}; raise executor.timeout_s"
            )
        if not r.ok:  # calibrate's one-line message, whatever the executor wrapped around it
            text = r.error or r.status
            found = re.search(rf"task {re.escape(task.id)}: .*", text)
            last = (text.strip().splitlines() or [r.status])[-1]
            raise TaskGradingError(
                found.group(0)
                if found
                else f"task {task.id}: measuring its baseline and reference failed: {last}"
            )


def build_domain(cfg: ResearchConfig, run: RunConfig) -> ResearchDomain:
    torch.set_num_threads(run.torch_threads)
    train, heldout = select_tasks(cfg)
    for line in unset_task_notes(cfg, train, heldout):
        logging.getLogger("wmrl").warning(line)
    all_tasks = list_tasks()
    executor = make_executor(run.executor, run.anchors.max_concurrent, ResearchDomain.worker_initializer)
    try:
        check_tasks_grade(run, train + heldout, executor)
    except BaseException:
        executor.close()
        raise
    cache = Path(cfg.cache_dir) / _key(_policy_fields(cfg, run, train))
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))
    policy, sft_info = build_policy(cfg, run, train, heldout, cache)
    log_path, random_path = log_paths(cfg, run, train)
    elog = build_execution_log(cfg, run, policy, train, executor, log_path)
    rlog = build_random_log(cfg, train, executor, random_path, run.tracking.progress)
    sft_examples, random_examples = elog.load(), rlog.load()
    examples = sft_examples + random_examples
    wm = build_world_model(cfg, run, policy.tokenizer, module_device(policy))
    wm_info = pretrain_world_model(
        cfg, run, wm, examples, cache, log_name(log_path, random_examples, random_path)
    )
    # The run's own log: the pretraining log's records, then every anchor execution of this run.
    # Data-parallel: every rank refines its WM on the same anchors; the main process alone logs them.
    run_log = ExecutionLog(Path(run.out_dir) / "execution_log.jsonl") if writes_run_dir() else None
    if run_log is not None and not run_log.path.exists():
        run_log.append(examples)
    world_model = ResearchWorldModel(
        wm, {t.id: t for t in all_tasks}, run_log, cfg.wm_update_steps, cfg.wm_input
    )
    prior_groups = None
    if method_of(run).wants_execution_log(run):
        prior_groups = prior_anchor_groups(
            cfg,
            run,
            sft_examples,
            random_examples,
            cache,
            log_name(log_path, random_examples, random_path),
            policy.tokenizer,
            module_device(policy),
        )
    domain = ResearchDomain(
        policy,
        world_model,
        train,
        heldout,
        executor,
        cfg.edit_mode,
        cfg.sandbox_timeout_s,
        cfg.max_prompt_tokens,
        cfg.eval_samples_per_task,
        cfg.eval_seed,
        seed=run.seed,
        prompt_style=cfg.prompt_style,
        prior_groups=prior_groups,
    )
    sft_eval = _sft_evaluation(cfg, run, domain, heldout, cache)
    domain.reference_scores = {
        "sft_score_mean": sft_eval["score_mean"],
        "sft_runnable_frac": sft_eval["runnable_frac"],
    }
    domain.remember_start_evaluation(sft_eval)
    _write_build_info(
        cfg, run, domain, cache, sft_info, wm_info, sft_examples, (random_path, random_examples), sft_eval
    )
    return domain


def _sft_evaluation(
    cfg: ResearchConfig, run: RunConfig, domain: ResearchDomain, heldout: list[Any], cache: Path
) -> dict:
    """The SFT policy's held-out evaluation (cached: it depends on the decoding, never on the method)."""
    eval_path = (
        cache
        / f"sft_eval-{_key([cfg.eval_samples_per_task, cfg.eval_seed, [t.id for t in heldout], *_decoding_key(cfg), *_data_key()])}.json"
    )
    if eval_path.exists():
        return json.loads(eval_path.read_text())
    with _stage(run, f"evaluating the SFT policy on {len(heldout)} held-out tasks"):
        sft_eval = domain.evaluate("eval")
    eval_path.write_text(json.dumps(sft_eval, indent=2))
    return sft_eval


def _write_build_info(
    cfg: ResearchConfig,
    run: RunConfig,
    domain: ResearchDomain,
    cache: Path,
    sft_info: dict,
    wm_info: dict,
    sft_examples: list,
    random_log: tuple[Path, list],
    sft_eval: dict,
) -> None:
    """``build_info.json`` (the build's measured figures) in the cache and on the domain, and the WM's
    pretraining executions in the run directory (apart from the RL budget)."""
    random_path, random_examples = random_log
    examples = sft_examples + random_examples
    runnable = [e.reward > FAILURE_SCORE for e in examples]
    info = {
        "cache": str(cache),
        "search_constraint": constrained(cfg),
        "search_constraint_replace": constrained(cfg) and cfg.search_constraint_replace,
        "search_constraint_values": constrained(cfg) and cfg.search_constraint_values,
        "sft": sft_info,
        "log": {
            "n": len(examples),
            "runnable_frac": sum(runnable) / max(len(runnable), 1),
            # executions made before training, apart from the RL budget (exec/real_total)
            "sft_samples": len(sft_examples),
            "random": random_info(random_path, random_examples),
        },
        "wm": wm_info,
        "sft_eval": sft_eval,
    }
    (cache / "build_info.json").write_text(json.dumps(info, indent=2))
    domain.build_info = info
    if writes_run_dir():  # the WM's pretraining executions, apart from the RL budget (wmrl.report reads it)
        offline = {"executions": len(sft_examples) + info["log"]["random"]["n"]}
        Path(run.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(run.out_dir) / OFFLINE_DATA).write_text(json.dumps(offline, indent=2))
