"""The WMRL training step (docs/design.md section 2) over any Domain. The trainer only orchestrates and
names no method: the update's math lives in wmrl/learner.py, what differs between methods in the
run's method object (wmrl/methods) and the state it keeps (its ``new_state``, checkpointed and logged
here without naming its parts), and the domain knows its tasks, policy and world model.

One step (:meth:`Trainer.train_step`)::

    tasks -> choose anchor groups -> generate (G rollouts per task, of the tasks the method selects)
          -> real execution of anchors  ┐ concurrently
          -> WM scores for every rollout┘ (a method with a WM; its placebo permutes them)
          -> the method: its WM rows' rewards (the anchor pairs feed its corrections
             first) and its per-row advantages
          -> clipped-ratio update (+ KL) ┐ beside
          -> WM refined on the anchors   ┘
          -> metrics, checkpoint
"""

from __future__ import annotations

import copy
import logging
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from wmrl.anchors import choose_anchor_groups
from wmrl.config import ConfigError, RunConfig, save_config
from wmrl.device import autocast, check_precision, module_device
from wmrl.distributed import gather_batches, gather_rewards, group_owner, task_shares
from wmrl.domain import Domain, JobRunner, Prediction, RolloutBatch, check_domain
from wmrl.executors import make_executor
from wmrl.extras import quiet_dataset_bars
from wmrl.learner import group_advantages, grpo_update, make_optimizer, policy_gradient
from wmrl.methods import Advantages, Step, method_of
from wmrl.methods.base import legacy_method_state, nanmean
from wmrl.tracking import (
    MetricsLogger,
    RunInterrupted,
    StopSignals,
    load_checkpoint,
    prepare_run_dir,
    save_checkpoint,
    set_aside_after_checkpoint,
    set_rng_state,
)

log = logging.getLogger("wmrl")


class UngradedRun(RuntimeError):
    """Every anchor rollout of ``tracking.max_ungraded_steps`` steps in a row came back ungraded."""


def _one_line(error: str) -> str:
    """A job's error as one short line, without the exception's class name."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    text = re.sub(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b:?\s*", "", lines[-1] if lines else error)
    return text[:300]


class _Ranks(NamedTuple):
    """Where a data-parallel step's groups live: ``owner`` ``[n_groups]`` each group's rank (None:
    one process); with sharded generation, ``local`` this rank's own batch and ``src_row`` ``[R]``
    each row's place in it (else None)."""

    owner: torch.Tensor | None
    local: RolloutBatch | None
    src_row: torch.Tensor | None


class Trainer:
    """One run's training loop. With ``accelerator`` (wmrl/distributed.py) it is one rank of a
    data-parallel run: it generates and executes its share of each step, the update's gradients are
    averaged by DDP, and only the main process writes the run directory."""

    def __init__(self, cfg: RunConfig, domain: Domain, resume: bool = False, accelerator=None):
        self.cfg = cfg
        self.domain = domain
        self.caps = check_domain(domain)  # the domain's optional members (wmrl/domain.py)
        self.run_dir = Path(cfg.out_dir)
        self.acc = accelerator
        self.world = 1 if accelerator is None else accelerator.num_processes
        self.rank = 0 if accelerator is None else accelerator.process_index
        self.is_main = accelerator is None or accelerator.is_main_process
        if self.is_main:
            prepare_run_dir(self.run_dir, resume)
        torch.set_num_threads(cfg.torch_threads)
        self.policy = domain.policy
        dev = module_device(self.policy)
        check_precision(cfg.precision, dev, self.caps.bf16_unsupported)
        # --precision=bf16: the policy's and the WM's forward passes under torch.autocast
        self.autocast = lambda: autocast(cfg.precision, dev)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, cfg.grpo)
        self.reference = None
        if cfg.grpo.kl_coef > 0:
            self.reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
        self.method = method_of(cfg)  # the registered `method` (wmrl/methods), its placebo under wm_placebo
        self.method_state = self.method.new_state(cfg)  # the components the method keeps between steps
        if self.method.wants_execution_log(cfg) and not resume:  # a resumed run restores what it began
            prior = self.caps.prior_anchor_groups
            self.method.start_from_log(self, None if prior is None else prior())
        self.task_gen = torch.Generator().manual_seed(cfg.seed)
        self.update_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.step = 0
        self.real_executions = 0
        self.generated_tasks = 0  # tasks this process generated rollouts for (its share, data-parallel)
        self.elapsed = 0.0  # training wall-clock so far, seconds (carried across resumes)
        self.saved_step = 0  # the step of the checkpoint on disk (0: none)
        self.ungraded_streak = 0  # steps in a row whose every anchor came back ungraded
        self.exec_error: str | None = None  # the first failed job's error of the last execution
        self._times: dict[str, float] = {}  # the step in progress's time/<phase> seconds
        self.executor: JobRunner | None = None
        self.owns_executor = False  # False while the executor is the domain's (its close is the domain's)
        if resume:
            self._restore()
        elif self.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
        self.model = None  # the accelerate-prepared (DDP) LogProbs of the policy, data-parallel only
        self.shard = accelerator is not None and cfg.distributed.generation == "shard"
        if accelerator is not None:
            from wmrl.distributed import LogProbs

            if self.shard and self.world > 1:  # one process keeps the domain's own sampling
                if self.caps.shard_rng is None:
                    raise ConfigError(
                        f"distributed.generation='shard' needs a domain with shard_rng (independent "
                        f"sampling noise per rank); {type(domain).__name__} has none: use "
                        "--distributed.generation=replicate"
                    )
            self.model, self.optimizer = accelerator.prepare(LogProbs(self.policy), self.optimizer)
        self.logger = MetricsLogger(self.run_dir, cfg, resume) if self.is_main else None
        # (batch, predicted, true rewards) of a step whose media are due
        self._media: tuple[RolloutBatch, torch.Tensor | None, torch.Tensor] | None = None

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "real_executions": self.real_executions,
            "elapsed": self.elapsed,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "method": self.method_state.state_dict(),
            "domain": self.domain.state_dict(),
            "task_gen": self.task_gen.get_state(),
            "update_gen": self.update_gen.get_state(),
        }

    def save(self) -> Path:
        path = save_checkpoint(self.run_dir, self.cfg, self.state_dict())
        self.saved_step = self.step
        return path

    def _restore(self) -> None:
        state = load_checkpoint(self.run_dir, self.cfg)
        self.step, self.real_executions = state["step"], state["real_executions"]
        self.saved_step = self.step
        self.elapsed = state.get("elapsed", 0.0)
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.method_state.load_state_dict(legacy_method_state(state))  # older checkpoints: top-level keys
        self.domain.load_state_dict(state["domain"])
        self.task_gen.set_state(state["task_gen"])
        self.update_gen.set_state(state["update_gen"])
        set_rng_state(state["rng"])
        if self.is_main:
            set_aside_after_checkpoint(self.run_dir, self.step)

    # ---- one step ----------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One step (the module docstring), the run's method answering its questions; its metrics."""
        cfg, method = self.cfg, self.method
        t_step, self._times = time.perf_counter(), {}
        n = cfg.grpo.tasks_per_step
        tasks = self.domain.sample_tasks(n, "train", self.task_gen)
        anchor_groups = choose_anchor_groups(n, method.n_anchor_groups(n, cfg.anchors), cfg.seed, self.step)
        tasks, anchor_groups = method.select_tasks(tasks, anchor_groups)
        with self._timed("generate"), torch.no_grad(), self.autocast():
            batch, ranks = self._generate(tasks, anchor_groups)
        batch.logprobs = batch.logprobs.float()  # sampled under autocast: the loss is in float32
        # A domain may append WM-only rows (imagined twins) that stand for real ones (batch.real_row).
        group_anchor = torch.zeros(batch.n_groups, dtype=torch.bool)
        group_anchor[: len(tasks)] = anchor_groups
        step = Step(batch, len(tasks), group_anchor, torch.full((batch.n_rollouts,), float("nan")))
        self._execute_and_predict(step, ranks)

        metrics: dict[str, float] = {}
        if step.pred is not None:  # the step's anchors feed the method's corrections first
            step.r_wm, wm_metrics = method.wm_scores(self, step)
            metrics.update(wm_metrics)
        result = method.advantages(self, step)
        metrics.update(result.metrics)
        oracle = self.domain.oracle_rewards(batch)
        if oracle is not None:
            metrics.update(self._update_error(batch, result.adv, result.used, oracle))
        metrics.update(self._update(step, result, ranks.owner))

        self.step += 1
        metrics.update(self._step_summary(step, result))
        if self.caps.step_metrics is not None:
            metrics.update({f"domain/{k}": float(v) for k, v in self.caps.step_metrics().items()})
        if self._media_due():  # logged by train() after the step's metrics
            self._media = (batch, None if step.pred is None else step.pred.mean.float(), step.r_true)
        step_time = time.perf_counter() - t_step
        self.elapsed += step_time
        metrics.update({"time/step": step_time, "time/elapsed": self.elapsed})
        return metrics

    @contextmanager
    def _timed(self, name: str):
        """Add the block's wall-clock seconds to this step's ``time/<name>``."""
        t0 = time.perf_counter()
        yield
        self._times[f"time/{name}"] = self._times.get(f"time/{name}", 0.0) + time.perf_counter() - t0

    def _generate(self, tasks: list, anchor_groups: torch.Tensor) -> tuple[RolloutBatch, _Ranks]:
        """The step's rollouts, and where a data-parallel run's groups live (:class:`_Ranks`)."""
        cfg = self.cfg
        owner = local = src_row = None  # data-parallel: each group's rank; this rank's own batch
        if self.shard:
            if self.world > 1 and self.caps.shard_rng is not None:  # this rank's sampling noise
                self.caps.shard_rng(self.rank, self.step)  # for this step (a resume redraws it)
            share = task_shares(len(tasks), self.world)[self.rank]
            if len(share):
                local = self.domain.generate(
                    tasks[share.start : share.stop],
                    cfg.grpo.group_size,
                    anchor_groups[share.start : share.stop],
                )
                self.generated_tasks += len(share)
            batch, owner, _, src_row = gather_batches(local, len(share), self.acc, self.caps.extras_padding)
        else:
            batch = self.domain.generate(tasks, cfg.grpo.group_size, anchor_groups)
            self.generated_tasks += len(tasks)
            if self.acc is not None:
                owner = group_owner(batch, len(tasks), self.world)
        return batch, _Ranks(owner, local, src_row)

    def _execute_and_predict(self, step: Step, ranks: _Ranks) -> None:
        """Real execution of the anchor rows (data-parallel: this rank's) in a thread while the WM
        scores the batch here (for a method that uses it): sets ``step.r_true`` (every rank's
        executions) and ``step.pred``."""
        batch, anchor_rows, owner = step.batch, step.anchor_rows, ranks.owner
        exec_rows = (
            anchor_rows if owner is None else anchor_rows[owner[batch.group_ids[anchor_rows]] == self.rank]
        )
        # A closed-loop domain's real rollouts came with their true rewards (batch.real_rewards):
        # taken as they are; the other anchor rows get execution jobs.
        source, source_rows = (
            (ranks.local, ranks.src_row[exec_rows]) if ranks.src_row is not None else (batch, exec_rows)
        )
        job_rows = exec_rows
        if source is not None and source.real_rewards is not None:
            known = source.real_rewards[source_rows].float()
            step.r_true[exec_rows] = known
            job_rows, source_rows = exec_rows[known.isnan()], source_rows[known.isnan()]
        jobs = (
            self.domain.execution_jobs(source, source_rows.tolist())
            if source is not None and job_rows.numel()
            else []
        )
        if jobs and self.executor is None:
            self._start_executor()
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = None
            if jobs:
                t0 = time.perf_counter()
                future = pool.submit(self._execute, jobs)
            if self.method.uses_wm:
                step.pred = self._predict(batch)
            if future is not None:
                results = future.result()
                self._times["time/execute"] = time.perf_counter() - t0
                if self.caps.execution_outcomes is not None:
                    self.caps.execution_outcomes(
                        [r.outcome for r in results if r.ok and r.outcome is not None]
                    )
                step.r_true[job_rows] = torch.tensor([res.reward for res in results], dtype=torch.float32)
        if self.acc is not None and anchor_rows.numel():  # every rank's true rewards, to every rank
            step.r_true = gather_rewards(
                exec_rows.tolist(), step.r_true[exec_rows].tolist(), batch.n_rollouts
            )
        self.real_executions += int(anchor_rows.numel())

    def _start_executor(self) -> None:
        # The domain's own pool when it holds one (one set of sandbox workers, not two); else one
        # created here, in the calling (main) thread, never in the worker thread of
        # _execute_and_predict: a local Ray cluster started from a thread that exits loses its GCS
        # and raylet within seconds.
        self.executor = self.caps.executor
        self.owns_executor = self.executor is None
        if self.owns_executor:
            init = self.caps.worker_initializer
            self.executor = make_executor(self.cfg.executor, self.cfg.anchors.max_concurrent, init)

    def _predict(self, batch: RolloutBatch) -> Prediction:
        """The WM's prediction of every row in float32, as the run's method sees it."""
        with self._timed("wm"), torch.no_grad(), self.autocast():
            pred = self.domain.world_model.predict(batch)
        pred = Prediction(pred.mean.float(), None if pred.var is None else pred.var.float())
        return self.method.prediction(pred, batch.group_ids, self.cfg.seed, self.step)

    def _update(self, step: Step, result: Advantages, owner: torch.Tensor | None) -> dict[str, float]:
        """The clipped-ratio policy update (+ KL) on the method's advantages and the WM's refinement
        on the step's graded anchors: the refinement does not depend on the update, so by default it
        runs in a thread beside it (torch releases the GIL inside its kernels)."""
        cfg, batch, r_true, anchor_rows = self.cfg, step.batch, step.r_true, step.anchor_rows
        graded = anchor_rows[torch.isfinite(r_true[anchor_rows])]  # an ungraded rollout teaches nothing
        refine_wm = self.method.uses_wm and graded.numel() > 0
        # [R] the rows of anchor tasks: executed rows and the WM-only rows standing for them (twins)
        is_anchor = step.group_anchor[batch.group_ids]
        anchor_task = is_anchor if batch.real_row is None else is_anchor | (batch.real_row >= 0)
        metrics: dict[str, float] = {}

        def wm_update() -> dict[str, float]:
            with self._timed("wm_update"):
                return self.domain.world_model.update(batch, graded, r_true[graded]) or {}

        with ThreadPoolExecutor(max_workers=1) as pool:
            wm_future = pool.submit(wm_update) if refine_wm and cfg.overlap_wm_update else None
            with self._timed("update"):
                self.policy.train()
                dev = module_device(self.policy)  # the domain put its policy on the run's device
                metrics.update(
                    grpo_update(
                        self.policy,
                        self.optimizer,
                        batch.to(dev),
                        result.adv.to(dev),
                        result.used.to(dev),
                        cfg.grpo,
                        self.reference,
                        self.update_gen,
                        owned=None if owner is None else (owner[batch.group_ids] == self.rank).to(dev),
                        accelerator=self.acc,
                        model=self.model,
                        autocast=self.autocast,
                        counted=None if result.counted is None else result.counted.to(dev),
                        anchor=anchor_task.to(dev),
                    )
                )
            if refine_wm:
                wm_metrics = wm_future.result() if wm_future is not None else wm_update()
                metrics.update({f"wm/{k}": v for k, v in wm_metrics.items()})
        return metrics

    def _step_summary(self, step: Step, result: Advantages) -> dict[str, float]:
        """The step's rewards, advantages and executions, the method's state, and times."""
        adv, used, anchor_rows = result.adv, result.used, step.anchor_rows
        return {
            "reward/mean": nanmean(step.rewards),
            "reward/anchor_true": nanmean(step.r_true),
            "adv/abs_mean": float(adv[used].abs().mean()) if used.any() else 0.0,
            "adv/used_frac": float(used.float().mean()),
            "anchors/fraction": float(step.group_anchor.sum()) / step.batch.n_groups,
            "exec/real_total": float(self.real_executions),
            "exec/step": float(anchor_rows.numel()),
            "exec/ungraded": float(int(torch.isnan(step.r_true[anchor_rows]).sum())),
            **self.method_state.metrics(),
            **self._times,
        }

    def _media_due(self) -> bool:
        """Whether this step's rollouts go to wandb as media (``tracking.media_every``, the main
        process, wandb on, a domain with ``rollout_media``)."""
        every = self.cfg.tracking.media_every
        return (
            every > 0
            and self.step % every == 0
            and self.logger is not None
            and self.logger.wandb_active
            and self.caps.rollout_media is not None
        )

    def _log_media(self) -> None:
        """The domain's ``rollout_media(batch, predicted, true)`` of the step kept by train_step: its
        RNG draws (a WM decoding frames) are undone, so logging media never changes a run."""
        if self._media is None or self.caps.rollout_media is None or self.logger is None:
            return  # none due (_media_due checks the two others)
        batch, predicted, true = self._media
        self._media = None
        with torch.random.fork_rng(), torch.no_grad():
            media = self.caps.rollout_media(batch, predicted, true)
        self.logger.log_media(self.step, media)

    def _execute(self, jobs):
        assert self.executor is not None, "the executor is created in the main thread (train_step)"
        results = self.executor.run(jobs)
        failed = [r for r in results if not r.ok]
        self.exec_error = _one_line(failed[0].error or failed[0].status) if failed else None
        return results

    def _update_error(
        self, batch: RolloutBatch, adv: torch.Tensor, used: torch.Tensor, oracle: torch.Tensor
    ) -> dict[str, float]:
        """||u_m / |u_m| - u_true / |u_true| ||^2 between this method's update direction and the one
        true rewards would give on the same rollouts (both gradients at the current parameters)."""
        cfg = self.cfg.grpo
        true_adv, true_used = group_advantages(oracle.float(), batch.group_ids, cfg.advantage, cfg.std_eps)
        if not used.any() or not true_used.any():
            return {"true_reward/batch": nanmean(oracle)}
        g_m = policy_gradient(self.policy, batch, adv, used, cfg)
        g_t = policy_gradient(self.policy, batch, true_adv, true_used, cfg)
        nm, nt = g_m.norm(), g_t.norm()
        err = float(((g_m / nm - g_t / nt) ** 2).sum()) if nm > 0 and nt > 0 else float("nan")
        return {"true_reward/batch": nanmean(oracle), "update_error": err}

    # ---- the loop ----------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        self.policy.eval()
        with torch.no_grad(), self.autocast():
            return {f"eval/{k}": v for k, v in self.domain.evaluate("eval").items()}

    def train(self) -> dict[str, float]:
        """Train to ``grpo.steps``; returns the last step's metrics.

        SIGINT/SIGTERM stop the run at the end of the step in progress with a checkpoint of it (a
        second signal stops it at once, keeping the last checkpoint): :class:`RunInterrupted`.
        ``tracking.max_ungraded_steps`` steps in a row with every anchor ungraded stop it with a
        checkpoint: :class:`UngradedRun`."""
        cfg = self.cfg
        bar = tqdm(
            total=cfg.grpo.steps,
            initial=self.step,
            desc=f"{cfg.method} seed={cfg.seed}",
            disable=not (cfg.tracking.progress and self.is_main),
            dynamic_ncols=True,
        )

        def notice(signum: int) -> None:  # the first signal: the bar says what happens next
            bar.set_description_str(f"stopping after step {self.step + 1} (again: stop now)", refresh=False)

        last: dict[str, float] = {}
        stop = StopSignals(on_first=notice)
        try:
            with stop, ExitStack() as restore:
                restore.callback(quiet_dataset_bars())  # the datasets library's bars off while training
                if self.step == 0 and cfg.tracking.eval_every > 0:
                    self._log(0, self._evaluate_shown(bar))
                while self.step < cfg.grpo.steps:
                    metrics = self.train_step()
                    every = cfg.tracking.eval_every
                    if (every > 0 and self.step % every == 0) or self.step == cfg.grpo.steps:
                        metrics.update(self._evaluate_shown(bar))
                    self._log(self.step, metrics)
                    self._log_media()
                    last = metrics
                    due = self.step % cfg.tracking.checkpoint_every == 0 or self.step == cfg.grpo.steps
                    ungraded = self._check_graded(metrics)
                    interrupted = self._agreed(stop.signum is not None)
                    if self.is_main and (due or ungraded or interrupted):
                        self.save()
                    if ungraded:
                        raise UngradedRun(ungraded)
                    if interrupted:
                        raise RunInterrupted(
                            stop.signum or signal.SIGTERM, self.run_dir, self.step, self.saved_step, True
                        )
                    bar.update(1)
                    shown = {"r": f"{metrics['reward/mean']:.3f}"} | self.method.progress(metrics)
                    bar.set_postfix(shown | {"real": int(metrics["exec/real_total"])}, refresh=False)
        except RunInterrupted:
            raise
        except KeyboardInterrupt:  # a second signal (or Ctrl-C outside the handler): stop at once
            if self.executor is not None:
                self.executor.cancel()
            signum = stop.signum or signal.SIGINT
            raise RunInterrupted(signum, self.run_dir, self.step, self.saved_step, False) from None
        finally:
            bar.close()
            if self.logger is not None:
                self.logger.close()
            if self.executor is not None and self.owns_executor:
                self.executor.close()
        if self.acc is not None:
            self.acc.wait_for_everyone()  # the main process's last checkpoint is written
        return last

    def _evaluate_shown(self, bar) -> dict[str, float]:
        """:meth:`evaluate`, the training bar saying so while it runs (minutes for a VLA)."""
        desc = getattr(bar, "desc", "")  # a disabled bar has none
        bar.set_description_str(f"{desc} (evaluating)")
        try:
            return self.evaluate()
        finally:
            bar.set_description_str(desc, refresh=False)

    def _agreed(self, local: bool) -> bool:
        """``local`` from any rank of a data-parallel run (so every rank stops at the same step)."""
        if self.acc is None or self.world == 1:
            return local
        flag = torch.tensor([float(local)], device=self.acc.device)
        return bool(self.acc.reduce(flag, reduction="sum").item() > 0)

    def _check_graded(self, metrics: dict[str, float]) -> str | None:
        """Count steps in a row whose every anchor rollout came back ungraded (``exec/ungraded ==
        exec/step > 0``, the same on every rank); warn at each, and return the message that stops
        the run once ``tracking.max_ungraded_steps`` of them come in a row (None: go on)."""
        n_exec, n_ungraded = metrics.get("exec/step", 0.0), metrics.get("exec/ungraded", 0.0)
        if not (n_exec > 0 and n_ungraded == n_exec):
            self.ungraded_streak = 0
            return None
        self.ungraded_streak += 1
        limit = self.cfg.tracking.max_ungraded_steps
        cause = f"first error: {self.exec_error}" if self.exec_error else "no error was reported"
        what = (
            f"step {self.step}: all {int(n_exec)} anchor rollouts came back ungraded "
            f"(exec/ungraded = exec/step; {cause})"
        )
        if limit == 0 or self.ungraded_streak < limit:
            if self.is_main:
                then = f"the run stops after {limit} such steps in a row" if limit else "training on"
                log.warning("%s; %s (tracking.max_ungraded_steps=%d)", what, then, limit)
            return None
        return (
            f"{what}, {self.ungraded_streak} steps in a row: real execution is failing, not the policy "
            f"(likely a task whose baseline fails here, or a broken sandbox or executor); checkpoint of "
            f"step {self.step} saved in {self.run_dir}: fix the cause, then `wmrl run --resume "
            f"{self.run_dir}` (--tracking.max_ungraded_steps=0 trains on regardless)"
        )

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger is not None:  # the main process only
            self.logger.log(step, metrics)
