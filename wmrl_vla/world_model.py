"""The core's WorldModel interface over the VLA world model (:class:`VLAWorldModel`): scoring every
rollout by imagining its own actions, online refinement on anchor rollouts, a calibrated variance."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
import torch

from wmrl.domain import Prediction, RolloutBatch
from wmrl_vla.config import VLAWMRefinement
from wmrl_vla.rollout import SimRollout, to_frames
from world_models.vla_dynamics import (
    VLADynamics,
    calibration_stats,
    fit_variance_calibration,
    rollout_score,
    success_auc,
    train_dynamics,
)


class VLAWorldModel:
    """The core's WorldModel interface over :class:`VLADynamics`, with online refinement and a
    calibrated variance.

    ``predict``'s variance is ``var_scale * (ensemble variance) + var_floor``
    (:func:`~world_models.vla_dynamics.fit_variance_calibration`): fitted first on held-out real
    episodes at pretraining (``calibration``), then refitted at every ``update`` on the last
    ``calib_window`` anchor pairs, each scored by the WM *before* it trains on them (held out). The
    z^2 of each step's anchors under the calibration fitted before them is logged
    (``wm/z2_raw``, ``wm/z2``), and so is ``wm/success_auc``: the ROC AUC of those held-out scores
    against the anchors' real success, over the same window (NaN until it holds a success and a
    failure): when it falls, the WM no longer tells this policy's successes from its failures.
    """

    def __init__(
        self,
        model: VLADynamics,
        episodes: list[dict],
        refinement: VLAWMRefinement | None = None,
        max_episodes: int = 2000,
        dataset: tuple[str, str] | None = None,
        seed: int = 0,
        calibration: tuple[float, float] = (1.0, 0.0),
        calib_window: int = 256,
        progress: bool = True,
    ) -> None:
        self.model = model
        self.var_scale, self.var_floor = (float(c) for c in calibration)
        self.refinement = refinement if refinement is not None else VLAWMRefinement()
        self.calib_window = calib_window
        self.calib_pairs: list[tuple[float, float]] = []  # (squared error, raw variance) of anchors
        self.outcome_pairs: list[tuple[float, float]] = []  # (held-out score, real success) of anchors
        self.initial_episodes = list(episodes)  # demos and the offline dataset, as built
        self.episodes = list(episodes)  # replay: demos, then anchor rollouts
        self.n_anchor_episodes = 0  # the replay's tail that anchors appended (a checkpoint keeps it)
        self.max_episodes = max_episodes
        # anchor rollouts go to the LeRobot dataset ``dataset`` = (root, repo_id), when given
        self.recorder = None if dataset is None else AnchorRecorder(*dataset, progress=progress)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=self.refinement.lr)
        self.n_updates = 0
        self.seed = seed

    @torch.no_grad()
    def raw_predict(self, batch: RolloutBatch) -> Prediction:
        """The members' mean rollout score and their (uncalibrated) variance ``[N]``."""
        ex = batch.extras
        prog, succ = self.model.score_actions(
            ex["init_images"],
            ex["init_states"],
            ex["wm_actions"],  # every action executed: a chunk policy's decisions cover several
            ex["wm_step_mask"].float(),
            ex["wm_instr"],
            ex["wm_goal"],
        )  # [K, N, T]
        scores = rollout_score(prog.cpu(), succ.cpu())  # [K, N]
        var = scores.var(0, unbiased=False) if scores.shape[0] > 1 else None
        return Prediction(mean=scores.mean(0), var=var)

    def predict(self, batch: RolloutBatch) -> Prediction:
        pred = self.raw_predict(batch)
        if pred.var is None:
            return pred
        return Prediction(mean=pred.mean, var=self.var_scale * pred.var + self.var_floor)

    def _calibrate(
        self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor
    ) -> dict[str, float]:
        """Score the new anchors (held out: the WM has not trained on them), log their z^2 under the
        calibration so far, add them to the window and refit; log the window's success AUC."""
        pred = self.raw_predict(batch.select(indices))
        if pred.var is None:
            return {}
        sq = ((pred.mean - rewards.float().cpu()) ** 2).numpy()
        var = pred.var.numpy()
        out = {
            "z2_raw": calibration_stats(sq, var)["z2_mean"],
            "z2": calibration_stats(sq, var, self.var_scale, self.var_floor)["z2_mean"],
        }
        self.calib_pairs = (self.calib_pairs + list(zip(sq.tolist(), var.tolist(), strict=True)))[
            -self.calib_window :
        ]
        pairs = np.asarray(self.calib_pairs)
        self.var_scale, self.var_floor = fit_variance_calibration(pairs[:, 0], pairs[:, 1])
        success = [float(batch.payload[int(i)]["success"]) for i in indices]
        self.outcome_pairs = (self.outcome_pairs + list(zip(pred.mean.tolist(), success, strict=True)))[
            -self.calib_window :
        ]
        scores, labels = np.asarray(self.outcome_pairs).T
        return {
            **out,
            "var_scale": self.var_scale,
            "var_floor": self.var_floor,
            "success_auc": success_auc(scores, labels),
        }

    def update(self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        new = [batch.payload[int(i)]["rollout"] for i in indices]
        new = [r for r in new if r is not None]
        if not new:
            return {}
        calib = self._calibrate(batch, indices, rewards) if self.refinement.calibrate else {}
        self.episodes.extend(r.as_episode() for r in new)
        self.n_anchor_episodes += len(new)
        self._trim_replay()
        waited = 0.0
        if self.recorder is not None:  # written in a process of its own while the WM trains here
            waited = self.recorder.wait_s
            self.recorder.submit(new)  # first waits for the previous write: not the WM's own time
            waited = self.recorder.wait_s - waited
        self.model.train()
        _, hist = train_dynamics(
            self.model,
            self.episodes,
            self.refinement.update_steps,
            self.refinement.batch_size,
            self.refinement.horizon,
            seed=self.seed + self.n_updates,
            optimizer=self.optimizer,
            state_horizon=self.refinement.state_horizon,
        )
        self.n_updates += 1
        return {
            "update_loss": float(np.mean(hist)) if hist else float("nan"),
            "episodes": float(len(self.episodes)),
            # seconds this update waited for the previous anchors' dataset write (inside the WM's
            # time/* figure, but the recording process's, not the WM's)
            "anchor_write_wait_s": waited,
            **calib,
        }

    def _trim_replay(self) -> None:
        """Keep the last ``max_episodes`` of the replay (the oldest demos go first)."""
        self.episodes = self.episodes[-self.max_episodes :]
        self.n_anchor_episodes = min(self.n_anchor_episodes, len(self.episodes))

    def state_dict(self) -> dict[str, Any]:
        """The WM's state for a checkpoint, with the anchor episodes in its replay (as tensors, so
        the checkpoint loads with ``weights_only=True``; about 0.45 MB an episode of 35 frames at
        64 px): a resumed run refines its WM on the same replay as an uninterrupted one. The anchors'
        dataset is flushed first, so that it holds every anchor the checkpointed WM trained on."""
        if self.recorder is not None:
            self.recorder.flush()
        anchors = self.episodes[len(self.episodes) - self.n_anchor_episodes :]
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "n_updates": self.n_updates,
            "calibration": [self.var_scale, self.var_floor],
            "calib_pairs": list(self.calib_pairs),
            "outcome_pairs": list(self.outcome_pairs),
            "anchor_episodes": [_episode_tensors(e) for e in anchors],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.n_updates = int(state["n_updates"])
        if "calibration" in state:  # checkpoints from before the calibration keep the raw variance
            self.var_scale, self.var_floor = (float(c) for c in state["calibration"])
            self.calib_pairs = [tuple(p) for p in state["calib_pairs"]]
            self.outcome_pairs = [tuple(p) for p in state.get("outcome_pairs", [])]
        # checkpoints from before the replay was kept resume on the demos and offline episodes alone
        anchors = [_episode_arrays(e) for e in state.get("anchor_episodes", [])]
        self.episodes = self.initial_episodes + anchors
        self.n_anchor_episodes = len(anchors)
        self._trim_replay()

    def close(self) -> None:
        """Finish the anchors' last write and stop the recording process."""
        if self.recorder is not None:
            self.recorder.close()


def _episode_tensors(episode: dict) -> dict:
    """A replay episode (numpy arrays, the instruction) with its arrays as tensors (no copy)."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in episode.items()}


def _episode_arrays(episode: dict) -> dict:
    """The inverse of :func:`_episode_tensors`: the same arrays, dtypes and values."""
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in episode.items()}


class AnchorRecorder:
    """Appends anchor rollouts to a LeRobot dataset ``(root, repo_id)`` in a process of its own.

    Writing a LeRobot episode is seconds of pure Python per step (PNG frames, then Hugging Face
    ``datasets`` re-reading and embedding them); in a thread it held the GIL against the step's
    training. Here it runs beside the run, one write in flight: :meth:`submit` first waits for the
    previous write (raising its error), :meth:`flush` waits for the last one (a checkpoint calls
    it), :meth:`close` flushes and stops the process. The training never reads the dataset, so
    where it is written changes no result."""

    def __init__(self, root: str, repo_id: str, progress: bool = True) -> None:
        self.root, self.repo_id = root, repo_id
        self.progress = progress  # tracking.progress: a wait for a write is shown as a stage
        self.wait_s = 0.0  # seconds spent waiting for writes to finish, in all
        self._pool: ProcessPoolExecutor | None = None
        self._pending: Future | None = None

    def submit(self, rollouts: list[SimRollout]) -> None:
        from wmrl_vla.data import append_episodes

        self.flush()
        if self._pool is None:
            self._pool = recording_pool()
        self._pending = self._pool.submit(
            append_episodes,
            self.root,
            self.repo_id,
            [to_frames(r) for r in rollouts],
            [r.task_id for r in rollouts],
            [r.seed for r in rollouts],
        )

    def flush(self) -> None:
        """Wait for the write in flight, shown as a stage while it runs (the first write starts the
        recording process and imports lerobot: tens of seconds, which a frozen training bar hid)."""
        import time

        from wmrl.tracking import stage

        pending, self._pending = self._pending, None
        if pending is not None:
            start = time.perf_counter()
            try:
                if pending.done():
                    pending.result()
                else:
                    with stage(
                        f"[vla] writing anchor rollouts to the LeRobot dataset {self.root}", self.progress
                    ):
                        pending.result()
            except Exception as e:
                raise RuntimeError(
                    f"recording anchor rollouts to the LeRobot dataset {self.root} failed: {e}"
                ) from e
            finally:
                self.wait_s += time.perf_counter() - start

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None


def recording_pool() -> ProcessPoolExecutor:
    """The one-worker pool :class:`AnchorRecorder` writes in: spawned, not forked (the parent holds
    torch's threads)."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
