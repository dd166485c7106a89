"""The WMRL training step (docs/design.md section 2) over any Domain. The trainer only orchestrates: the
math lives in learner/debias/denoise, the domain knows its tasks, policy and world model.

One step::

    tasks -> generate (G rollouts per task) -> choose anchor groups
          -> real execution of anchors  ┐ concurrently
          -> WM scores for every rollout┘
          -> calibration f refitted on anchor (r_hat, r); anchors use r, the rest f(r_hat)
          -> group advantages; anchor advantages * w; optional per-sample WM weights
          -> clipped-ratio update (+ KL) -> WM refined on the anchors -> metrics, checkpoint
"""

from __future__ import annotations

import copy
import logging
import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from wmrl.anchors import choose_anchor_groups
from wmrl.config import ConfigError, RunConfig, save_config
from wmrl.controls import placebo_groups, placebo_prediction
from wmrl.debias import OnlineDebiaser, centred_residual
from wmrl.denoise import InverseVarianceDenoiser, normalise_weights, sample_weights
from wmrl.device import autocast, check_precision, module_device
from wmrl.distributed import gather_batches, gather_rewards, group_owner, task_shares
from wmrl.domain import Domain, JobRunner, Prediction, RolloutBatch, check_domain
from wmrl.executors import make_executor
from wmrl.learner import group_advantages, grpo_update, make_optimizer, policy_gradient, score_directions
from wmrl.ppi import PowerTuner, anchor_moments, gradient_row_products, ppi_rows, variance_ratio
from wmrl.tracking import (
    MetricsLogger,
    RunInterrupted,
    StopSignals,
    load_checkpoint,
    prepare_run_dir,
    save_checkpoint,
    set_rng_state,
    trim_metrics_after,
)

log = logging.getLogger("wmrl")


class UngradedRun(RuntimeError):
    """Every anchor rollout of ``tracking.max_ungraded_steps`` steps in a row came back ungraded."""


def _one_line(error: str) -> str:
    """A job's error as one short line, without the exception's class name."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    text = re.sub(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b:?\s*", "", lines[-1] if lines else error)
    return text[:300]


@contextmanager
def _quiet_dataset_bars():
    """Silence the datasets library's "Map" bars while training (a domain that writes a dataset,
    e.g. the VLA anchors' LeRobot dataset, would draw one per write below the training bar). If
    datasets is first imported during training, its bars stay off for the rest of the process
    (the environment variable it reads at import has the last word)."""
    datasets = sys.modules.get("datasets")
    was = os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS")
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read when datasets is first imported
    enabled = datasets is not None and datasets.is_progress_bar_enabled()
    if enabled and datasets is not None:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was is None:
            os.environ.pop("HF_DATASETS_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = was
        if enabled and datasets is not None:
            datasets.enable_progress_bars()


def _nanmean(x: torch.Tensor) -> float:
    x = x[torch.isfinite(x)]
    return float(x.mean()) if x.numel() else float("nan")


def _correlation(
    cross: torch.Tensor | float, wm_sq: torch.Tensor | float, true_sq: torch.Tensor | float
) -> float:
    """``c / sqrt(σ̂² σ²)`` from summed moments (NaN when either variance is 0)."""
    denom = float(wm_sq * true_sq) ** 0.5
    return float(cross) / denom if denom > 0 else float("nan")


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
        self.debiaser = OnlineDebiaser(cfg.debias)
        self.denoiser = InverseVarianceDenoiser(cfg.denoise)
        self.tuner = PowerTuner(cfg.ppi, cfg.grpo.advantage, cfg.grpo.std_eps)
        if cfg.method == "ppi" and cfg.ppi.prior_from_log and not resume:  # a resumed run restores them
            prior = self.caps.prior_anchor_groups
            self._seed_tuner(None if prior is None else prior())
        self.task_gen = torch.Generator().manual_seed(cfg.seed)
        self.update_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.step = 0
        self.real_executions = 0
        self.generated_tasks = 0  # tasks this process generated rollouts for (its share, data-parallel)
        self.elapsed = 0.0  # training wall-clock so far, seconds (carried across resumes)
        self.saved_step = 0  # the step of the checkpoint on disk (0: none)
        self.ungraded_streak = 0  # steps in a row whose every anchor came back ungraded
        self.exec_error: str | None = None  # the first failed job's error of the last execution
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

    def _seed_tuner(self, groups: list[tuple[list[float], list[float]]] | None) -> None:
        """Start ``λ``'s window with the domain's prior anchor groups ``(raw WM scores, true
        rewards)`` (``ppi.prior_from_log``)."""
        if groups is None:
            raise ConfigError(
                f"ppi.prior_from_log: {type(self.domain).__name__} built no prior_anchor_groups"
            )
        if self.cfg.wm_placebo:  # the placebo control: the log's WM scores permuted too
            groups = placebo_groups(groups, self.cfg.seed)
        for r_hat, r_true in groups:
            n = len(r_hat)
            self.tuner.observe(torch.tensor(r_hat), torch.tensor(r_true), torch.zeros(n, dtype=torch.long))
        c, h, t = self.tuner.moments(calibrate=False)
        rho = _correlation(c, h, t)
        logging.getLogger(__name__).info(
            "ppi: lambda's window starts with %d groups from the execution log (their rho %.2f)",
            len(groups),
            rho,
        )

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "real_executions": self.real_executions,
            "elapsed": self.elapsed,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "debiaser": self.debiaser.state_dict(),
            "denoiser": self.denoiser.state_dict(),
            "ppi": self.tuner.state_dict(),
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
        self.debiaser.load_state_dict(state["debiaser"])
        self.denoiser.load_state_dict(state["denoiser"])
        if "ppi" in state:  # checkpoints from before the ppi method have none
            self.tuner.load_state_dict(state["ppi"])
        self.domain.load_state_dict(state["domain"])
        self.task_gen.set_state(state["task_gen"])
        self.update_gen.set_state(state["update_gen"])
        set_rng_state(state["rng"])
        if self.is_main:
            trim_metrics_after(self.run_dir, self.step)

    # ---- one step ----------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        cfg, method = self.cfg, self.cfg.method
        times: dict[str, float] = {}

        @contextmanager
        def timed(name: str):
            t0 = time.perf_counter()
            yield
            times[f"time/{name}"] = times.get(f"time/{name}", 0.0) + time.perf_counter() - t0

        t_step = time.perf_counter()
        n = cfg.grpo.tasks_per_step
        tasks = self.domain.sample_tasks(n, "train", self.task_gen)
        anchor_groups = choose_anchor_groups(n, method, cfg.anchors, cfg.seed, self.step)
        if method == "anchors_only":  # GRPO on the anchor tasks alone: the others are not generated
            tasks = [t for t, a in zip(tasks, anchor_groups.tolist(), strict=True) if a]
            anchor_groups = torch.ones(len(tasks), dtype=torch.bool)
        owner = local = src_row = None  # data-parallel: each group's rank; this rank's own batch
        with timed("generate"), torch.no_grad(), self.autocast():
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
                batch, owner, _, src_row = gather_batches(
                    local, len(share), self.acc, self.caps.extras_padding
                )
            else:
                batch = self.domain.generate(tasks, cfg.grpo.group_size, anchor_groups)
                self.generated_tasks += len(tasks)
                if self.acc is not None:
                    owner = group_owner(batch, len(tasks), self.world)
        batch.logprobs = batch.logprobs.float()  # sampled under autocast: the loss is in float32
        # A domain may append WM-only rows (imagined twins) that stand for real ones (batch.real_row).
        group_anchor = torch.zeros(batch.n_groups, dtype=torch.bool)
        group_anchor[: len(tasks)] = anchor_groups
        is_anchor = group_anchor[batch.group_ids]
        anchor_rows = is_anchor.nonzero().squeeze(-1)
        anchor_task = is_anchor | (batch.real_row >= 0) if batch.real_row is not None else is_anchor  # [N]

        # Real execution (anchor rows; data-parallel: this rank's) runs in a thread while the WM
        # scores the batch here.
        exec_rows = (
            anchor_rows if owner is None else anchor_rows[owner[batch.group_ids[anchor_rows]] == self.rank]
        )
        # A closed-loop domain's real rollouts came with their true rewards (batch.real_rewards):
        # taken as they are; the other anchor rows get execution jobs.
        source, source_rows = (local, src_row[exec_rows]) if src_row is not None else (batch, exec_rows)
        r_true = torch.full((batch.n_rollouts,), float("nan"))
        job_rows = exec_rows
        if source is not None and source.real_rewards is not None:
            known = source.real_rewards[source_rows].float()
            r_true[exec_rows] = known
            job_rows, source_rows = exec_rows[known.isnan()], source_rows[known.isnan()]
        jobs = (
            self.domain.execution_jobs(source, source_rows.tolist())
            if source is not None and job_rows.numel()
            else []
        )
        pred = None
        if jobs and self.executor is None:
            # The domain's own pool when it holds one (one set of sandbox workers, not two); else one
            # created here, in the calling (main) thread, never in the worker thread below: a local
            # Ray cluster started from a thread that exits loses its GCS and raylet within seconds.
            self.executor = self.caps.executor
            self.owns_executor = self.executor is None
            if self.owns_executor:
                init = self.caps.worker_initializer
                self.executor = make_executor(self.cfg.executor, self.cfg.anchors.max_concurrent, init)
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = None
            if jobs:
                t0 = time.perf_counter()
                future = pool.submit(self._execute, jobs)
            if cfg.uses_wm:
                with timed("wm"), torch.no_grad(), self.autocast():
                    pred = self.domain.world_model.predict(batch)
                pred = Prediction(pred.mean.float(), None if pred.var is None else pred.var.float())
                if cfg.wm_placebo:  # the placebo control: scores permuted within each group
                    pred = placebo_prediction(pred, batch.group_ids, cfg.seed, self.step)
            if future is not None:
                results = future.result()
                times["time/execute"] = time.perf_counter() - t0
                r_true[job_rows] = torch.tensor([res.reward for res in results], dtype=torch.float32)
        if self.acc is not None and anchor_rows.numel():  # every rank's true rewards, to every rank
            r_true = gather_rewards(exec_rows.tolist(), r_true[exec_rows].tolist(), batch.n_rollouts)
        n_exec = int(anchor_rows.numel())
        self.real_executions += n_exec
        exec_failed = int(torch.isnan(r_true[anchor_rows]).sum())

        metrics: dict[str, float] = {}
        rewards = r_true.clone()
        if pred is not None:
            r_hat = pred.mean.float()
            r_before = self.debiaser(r_hat)  # the calibration fitted before this step's anchors
            metrics.update(self._correct(batch, r_hat, r_true, anchor_rows))
            # ppi keeps the calibration fitted before the step (its correction must not see the step's
            # anchors); the other calibrating methods use the one refitted on them.
            r_wm = (
                r_hat if not cfg.uses_calibration else r_before if method == "ppi" else self.debiaser(r_hat)
            )
            rewards = torch.where(is_anchor, r_true, r_wm)

        counted = None  # the rows the loss divides by (None: the used ones)
        if method == "ppi":
            assert pred is not None, "ppi uses the world model"
            adv, used, counted, ppi_metrics = self._ppi(
                batch, r_hat, pred.var, r_wm, r_true, group_anchor, len(tasks)
            )
            metrics.update(ppi_metrics)
        else:
            adv, used = self._weighted_advantages(batch, rewards, is_anchor, pred)

        oracle = self.domain.oracle_rewards(batch)
        if oracle is not None:
            metrics.update(self._update_error(batch, adv, used, oracle))

        # The WM's refinement on this step's anchors does not depend on the policy update, so by
        # default it runs in a thread beside it (torch releases the GIL inside its kernels).
        graded = anchor_rows[torch.isfinite(r_true[anchor_rows])]  # an ungraded rollout teaches nothing
        refine_wm = cfg.uses_wm and method != "wm" and graded.numel() > 0

        def wm_update() -> dict[str, float]:
            with timed("wm_update"):
                return self.domain.world_model.update(batch, graded, r_true[graded]) or {}

        with ThreadPoolExecutor(max_workers=1) as pool:
            wm_future = pool.submit(wm_update) if refine_wm and cfg.overlap_wm_update else None
            with timed("update"):
                self.policy.train()
                dev = module_device(self.policy)  # the domain put its policy on the run's device
                metrics.update(
                    grpo_update(
                        self.policy,
                        self.optimizer,
                        batch.to(dev),
                        adv.to(dev),
                        used.to(dev),
                        cfg.grpo,
                        self.reference,
                        self.update_gen,
                        owned=None if owner is None else (owner[batch.group_ids] == self.rank).to(dev),
                        accelerator=self.acc,
                        model=self.model,
                        autocast=self.autocast,
                        counted=None if counted is None else counted.to(dev),
                        anchor=anchor_task.to(dev),
                    )
                )
            if refine_wm:
                wm_metrics = wm_future.result() if wm_future is not None else wm_update()
                metrics.update({f"wm/{k}": v for k, v in wm_metrics.items()})

        self.step += 1
        n_groups = batch.n_groups
        metrics.update(
            {
                "reward/mean": _nanmean(rewards),
                "reward/anchor_true": _nanmean(r_true),
                "adv/abs_mean": float(adv[used].abs().mean()) if used.any() else 0.0,
                "adv/used_frac": float(used.float().mean()),
                "anchors/fraction": float(anchor_groups.sum()) / n_groups,
                "exec/real_total": float(self.real_executions),
                "exec/step": float(n_exec),
                "exec/ungraded": float(exec_failed),
                "denoise/w": self.denoiser.w,
                "denoise/s2": float("nan") if self.denoiser.s2 is None else self.denoiser.s2,
                "debias/fitted": float(self.debiaser.fitted),
                **times,
            }
        )
        if self.caps.step_metrics is not None:
            metrics.update({f"domain/{k}": float(v) for k, v in self.caps.step_metrics().items()})
        if self._media_due():  # logged by train() after the step's metrics
            self._media = (batch, None if pred is None else pred.mean.float(), r_true)
        step_time = time.perf_counter() - t_step
        self.elapsed += step_time
        metrics.update({"time/step": step_time, "time/elapsed": self.elapsed})
        return metrics

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

    def _weighted_advantages(
        self, batch: RolloutBatch, rewards: torch.Tensor, is_anchor: torch.Tensor, pred: Prediction | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Group advantages of the mixed rewards; anchor rows weighted by the denoiser's ``w`` and
        WM rows optionally by their reported variance (the methods other than ``ppi``)."""
        cfg = self.cfg
        adv, used = group_advantages(rewards, batch.group_ids, cfg.grpo.advantage, cfg.grpo.std_eps)
        weights = torch.ones_like(adv)
        if cfg.uses_anchor_weight:
            weights = torch.where(is_anchor, torch.full_like(adv, self.denoiser.w), weights)
        if (
            cfg.denoise.sample_weights
            and cfg.uses_anchor_weight
            and pred is not None
            and pred.var is not None
        ):
            wm_rows = ~is_anchor & torch.isfinite(pred.var)
            if wm_rows.any():
                sw = sample_weights(
                    pred.var[wm_rows].float(), cfg.denoise.var_floor, cfg.denoise.sample_weight_max
                )
                weights[wm_rows] = sw
        return adv * normalise_weights(weights, used), used

    def _ppi(
        self,
        batch: RolloutBatch,
        r_hat: torch.Tensor,
        var: torch.Tensor | None,
        r_cal: torch.Tensor,
        r_true: torch.Tensor,
        group_anchor: torch.Tensor,
        n_tasks: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
        """Prediction-powered advantages (wmrl/ppi.py) with the λ pooled from earlier steps, then
        this step's anchor moments folded into the tuner for the steps after it. Returns the
        advantages, the rows in the loss, the rows its denominator counts (:func:`ppi_rows`) and metrics.

        ``r_hat`` ``[R]``: raw WM scores, ``var`` their reported variances or None; ``r_cal`` ``[R]``: the same under the calibration fitted
        before this step; ``r_true`` ``[R]``
        true rewards (NaN off executed rows); ``group_anchor`` ``[n_groups]`` the executed groups.
        """
        g = self.cfg.grpo
        calibrate = self.cfg.uses_calibration and self.debiaser.fitted
        lam = self.tuner.lam(calibrate, var)
        n_anchors = int(group_anchor.sum())
        p = ppi_rows(
            r_true, r_cal, batch.group_ids, group_anchor, batch.real_row, n_tasks, lam, g.advantage, g.std_eps
        )
        gid, pair, adv_true, adv_wm = batch.group_ids, p.pair, p.adv_true, p.adv_wm

        lam_mean = float(torch.as_tensor(lam, dtype=torch.float64).mean())
        out = {
            "ppi/lambda": lam_mean,
            "ppi/rho": float("nan"),
            "ppi/shrink": self.tuner.shrink_factor(calibrate),
        }
        ratio = variance_ratio(*self.tuner.moments(calibrate), lam_mean, n_anchors / n_tasks)
        wm_rows = p.paired.nonzero().squeeze(-1)
        if wm_rows.numel():  # this step's anchors: their correlation, then into the window for later steps
            anchor_gid = torch.unique(gid[wm_rows], return_inverse=True)[1]
            cross, wm_sq, true_sq = anchor_moments(adv_true[pair[wm_rows]], adv_wm[wm_rows], anchor_gid)
            out["ppi/rho"] = _correlation(cross.sum(), wm_sq.sum(), true_sq.sum())
            gram = None
            if self.cfg.ppi.moments == "gradient":
                t0 = time.perf_counter()
                s = score_directions(self.policy, batch, torch.cat([pair[wm_rows], wm_rows]), g.loss_agg)
                gram = s @ s.T
                out["time/ppi_directions"] = time.perf_counter() - t0
                on_grad = gradient_row_products(adv_true[pair[wm_rows]], adv_wm[wm_rows], gram).sum(0)
                out["ppi/rho_grad"] = _correlation(*on_grad)
            self.tuner.observe(
                r_hat[wm_rows], r_true[pair[wm_rows]], anchor_gid, None if var is None else var[wm_rows], gram
            )
        out["ppi/var_ratio"] = ratio
        out["ppi/eff_groups"] = n_anchors / ratio if ratio > 0 else float("nan")
        return p.adv, p.used, p.counted, out

    def _execute(self, jobs):
        assert self.executor is not None, "the executor is created in the main thread (train_step)"
        results = self.executor.run(jobs)
        failed = [r for r in results if not r.ok]
        self.exec_error = _one_line(failed[0].error or failed[0].status) if failed else None
        return results

    def _correct(
        self, batch: RolloutBatch, r_hat: torch.Tensor, r_true: torch.Tensor, anchor_rows: torch.Tensor
    ) -> dict[str, float]:
        """Measure the WM error on this step's anchors with the calibration fitted *before* them
        (out of sample), feed the denoiser, then refit the calibration on the new pairs."""
        out: dict[str, float] = {"wm/pred_mean": _nanmean(r_hat)}
        if anchor_rows.numel() == 0:
            return out
        gid = batch.group_ids[anchor_rows]
        gid = torch.unique(gid, return_inverse=True)[1]
        a_hat, a_true = r_hat[anchor_rows], r_true[anchor_rows]
        a_cal = self.debiaser(a_hat)
        out["wm/residual_before"] = _nanmean(centred_residual(a_hat, a_true, gid))
        out["wm/residual_after"] = _nanmean(centred_residual(a_cal, a_true, gid))
        if self.cfg.uses_anchor_weight:
            self.denoiser.observe(a_cal if self.cfg.uses_calibration else a_hat, a_true, gid)
        if self.cfg.uses_calibration:
            out["debias/refit"] = float(self.debiaser.observe(a_hat, a_true))
        return out

    def _update_error(
        self, batch: RolloutBatch, adv: torch.Tensor, used: torch.Tensor, oracle: torch.Tensor
    ) -> dict[str, float]:
        """||u_m / |u_m| - u_true / |u_true| ||^2 between this method's update direction and the one
        true rewards would give on the same rollouts (both gradients at the current parameters)."""
        cfg = self.cfg.grpo
        true_adv, true_used = group_advantages(oracle.float(), batch.group_ids, cfg.advantage, cfg.std_eps)
        if not used.any() or not true_used.any():
            return {"true_reward/batch": _nanmean(oracle)}
        g_m = policy_gradient(self.policy, batch, adv, used, cfg)
        g_t = policy_gradient(self.policy, batch, true_adv, true_used, cfg)
        nm, nt = g_m.norm(), g_t.norm()
        err = float(((g_m / nm - g_t / nt) ** 2).sum()) if nm > 0 and nt > 0 else float("nan")
        return {"true_reward/batch": _nanmean(oracle), "update_error": err}

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
            with stop, _quiet_dataset_bars():
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
                    shown = {"r": f"{metrics['reward/mean']:.3f}"}
                    if "ppi/lambda" in metrics:
                        shown |= {"lam": f"{metrics['ppi/lambda']:.2f}", "rho": f"{metrics['ppi/rho']:.2f}"}
                    else:
                        shown["w"] = f"{metrics['denoise/w']:.2f}"
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
