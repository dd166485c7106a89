"""The AutoResearch domain adapter: research tasks -> LLM edits -> sandboxed execution or outcome WM.

A rollout is one completion of the policy: search/replace edits of the task's baseline
``solution.py``. Edits are applied (or rejected, with a reason) right after sampling; a rejected
edit earns ``FAILURE_SCORE`` without a sandbox run, and the world model scores it as such too (the
check is free and exact). Applied edits are scored by the outcome WM, and anchors by the sandbox
through ``wmrl_research.grading.graded_reward`` (the score and the sandbox's status, counted by
:meth:`ResearchDomain.execution_outcomes`).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from wmrl.domain import Graded, Job, Prediction, PriorGroups, RolloutBatch
from wmrl.executors import Executor
from wmrl_research.constrain import EXTRA_ALLOWED
from wmrl_research.edits import apply_edits, knobs_view
from wmrl_research.grading import warm_up
from wmrl_research.policy import ResearchPolicy
from wmrl_research.prompts import build_prompt
from wmrl_research.sandbox_config import STATUSES
from wmrl_research.tasks import FAILURE_SCORE
from world_models.outcome import ExecutionLog, OutcomeExample

log = logging.getLogger("wmrl")

#: how a training execution can end (step_metrics): the sandbox's statuses, then an edit that did not
#: apply (the failure score without a run)
EXECUTION_OUTCOMES = (*STATUSES, "rejected")


@dataclass
class EditRollout:
    """One rollout's payload: the completion and the edited solution (None when rejected)."""

    task_id: str
    completion: str
    source: str | None
    reason: str = ""

    @property
    def applied(self) -> bool:
        return self.source is not None


def parameter_digest(module: torch.nn.Module) -> str:
    """SHA-1 of a module's state (names and bytes): equal digests, equal parameters."""
    h = hashlib.sha1()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def rejected_reward() -> float:
    """The reward of an edit that does not apply: the failure score, without a sandbox run."""
    return FAILURE_SCORE


def rejected_job() -> Graded:
    """The execution job of an edit that does not apply: :func:`rejected_reward`, outcome
    ``"rejected"``."""
    return Graded(rejected_reward(), "rejected")


def task_text(task: Any) -> str:
    """The WM's short view of a task."""
    return f"{task.id} | {task.kind} | {task.metric}"


def solution_text(task: Any, source: str, max_diff_lines: int = 40) -> str:
    """The WM's view of a solution: its knobs, then any lines changed outside the knobs block."""
    from wmrl_research.edits import EditError

    try:
        view = knobs_view(source)
    except EditError:  # a free-mode edit removed the knobs markers
        view = ""
    base_rest = task.baseline_source.replace(_block_or_empty(task.baseline_source), "")
    rest = source.replace(_block_or_empty(source), "")
    if rest != base_rest:
        diff = difflib.unified_diff(base_rest.splitlines(), rest.splitlines(), lineterm="", n=0)
        lines = [d for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]
        view += "\n".join(lines[:max_diff_lines]) + "\n"
    return view


def _block_or_empty(source: str) -> str:
    from wmrl_research.edits import EditError, knobs_block

    try:
        return knobs_block(source)
    except EditError:
        return ""


def to_example(task: Any, source: str, reward: float, origin: str, status: str = "") -> OutcomeExample:
    return OutcomeExample(
        task.id, task_text(task), solution_text(task, source), float(reward), status, origin
    )


def rejected_example(task: Any, rollout: EditRollout) -> OutcomeExample:
    """The log record of an anchor edit that did not apply: what the agent wrote (as its
    ``solution_text``), the failure score, ``status = "rejected: <reason>"`` and ``source =
    "rejected"``, so that a run's log says why each failed edit failed (no WM ever trains on it:
    the rejection is exact and free)."""
    return OutcomeExample(
        task.id,
        task_text(task),
        rollout.completion,
        rejected_reward(),
        f"rejected: {rollout.reason}",
        "rejected",
    )


WM_INPUTS = ("view", "edit")


def edit_text(task: Any, view: str) -> str:
    """The WM's edit-only view of a solution: each knob whose value differs from the task's baseline
    as ``NAME = new (was old)``, then any other line of ``view`` (free-mode diff lines) as it is;
    ``no change`` for the baseline itself.

    Lossless given the task (every solution is the task's baseline plus edits), and it leaves the
    encoder's mean pooling only the tokens that differ between the rollouts of one group, which the
    full knobs view (the same four of five lines in every rollout of a group) dilutes.
    """
    base: dict[str, str] = {}
    for line in knobs_view(task.baseline_source).splitlines():
        name, _, value = line.partition(" = ")
        base[name] = value
    out = []
    for line in view.splitlines():
        name, sep, value = line.partition(" = ")
        if sep and name in base:
            if value != base[name]:
                out.append(f"{name} = {value} (was {base[name]})")
        elif line.strip():
            out.append(line)
    return "\n".join(out) + "\n" if out else "no change\n"


def wm_solution_text(task: Any, view: str, wm_input: str) -> str:
    """What the outcome WM reads of a solution whose knobs view is ``view``, under ``wm_input``."""
    if wm_input == "view":
        return view
    if wm_input == "edit":
        return edit_text(task, view)
    raise ValueError(f"wm_input={wm_input!r} is not one of {', '.join(WM_INPUTS)}")


def wm_example(task: Any, example: OutcomeExample, wm_input: str) -> OutcomeExample:
    """``example`` (stored with the full knobs view) as the outcome WM reads it under ``wm_input``."""
    if wm_input == "view":
        return example
    return replace(example, solution_text=wm_solution_text(task, example.solution_text, wm_input))


class ResearchWorldModel:
    """The domain's WM: rejected edits -> failure score (exact); applied edits -> the outcome model.

    ``update`` appends the anchor executions to the execution log on disk (with the full knobs view)
    and refines the outcome model on them (plus replay); anchor edits that did not apply are logged
    with their reason (:func:`rejected_example`) and not learnt from. ``wm_input`` is what the outcome
    model reads of a solution: ``view`` (its knobs view) or ``edit`` (:func:`edit_text`).
    """

    def __init__(
        self,
        model: Any,
        tasks: dict[str, Any],
        log: ExecutionLog | None,
        update_steps: int,
        wm_input: str = "view",
    ):
        if wm_input not in WM_INPUTS:
            raise ValueError(f"wm_input={wm_input!r} is not one of {', '.join(WM_INPUTS)}")
        self.model = model
        self.tasks = tasks
        self.log = log
        self.update_steps = update_steps
        self.wm_input = wm_input
        self.reject_var = 1e-6

    def predict(self, batch: RolloutBatch) -> Prediction:
        n = batch.n_rollouts
        mean = torch.full((n,), float(FAILURE_SCORE))
        var = torch.full((n,), self.reject_var)
        rows = [i for i, p in enumerate(batch.payload) if p.applied]
        if rows:
            ps = [batch.payload[i] for i in rows]
            row_tasks = [self.tasks[p.task_id] for p in ps]
            views = [
                wm_solution_text(t, solution_text(t, p.source), self.wm_input)
                for t, p in zip(row_tasks, ps, strict=True)
            ]
            m, v = self.model.predict([task_text(t) for t in row_tasks], views)
            mean[rows], var[rows] = m.float(), v.float()
        return Prediction(mean, var)

    def update(self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        examples, rejected = [], []
        for i, r in zip(indices.tolist(), rewards.tolist(), strict=True):
            p = batch.payload[i]
            if r != r:  # NaN: ungraded, skipped
                continue
            if p.applied:  # executed and graded
                examples.append(to_example(self.tasks[p.task_id], p.source, r, "anchor"))
            else:  # graded the failure score without a run (rejected_reward)
                rejected.append(rejected_example(self.tasks[p.task_id], p))
        if self.log is not None and rejected:
            self.log.append(rejected)
        if not examples:
            return {"update_examples": 0.0}
        if self.log is not None:
            self.log.append(examples)
        out = self.model.update(
            [wm_example(self.tasks[e.task_id], e, self.wm_input) for e in examples], self.update_steps
        )
        return {"update_examples": float(len(examples)), **{k.removeprefix("wm/"): v for k, v in out.items()}}

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict_full()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict_full(state)


class ResearchDomain:
    """Implements :class:`wmrl.domain.Domain` for research tasks."""

    # Each execution worker starts its sandbox before taking jobs (imports: 5-25 s on 2 cores), so
    # that this start-up never counts against an execution's timeout.
    worker_initializer = staticmethod(warm_up)

    def __init__(
        self,
        policy: ResearchPolicy,
        world_model: ResearchWorldModel,
        train_tasks: Sequence[Any],
        eval_tasks: Sequence[Any],
        executor: Executor,
        mode: str = "knobs",
        timeout_s: float = 60.0,
        max_prompt_tokens: int = 512,
        eval_samples_per_task: int = 8,
        eval_seed: int = 1234,
        seed: int = 0,
        reference_scores: dict[str, float] | None = None,
        prompt_style: str = "full",
        prior_groups: PriorGroups | None = None,
    ):
        if not train_tasks or not eval_tasks:
            raise ValueError(f"need train and eval tasks, got {len(train_tasks)} and {len(eval_tasks)}")
        self.policy = policy
        self.world_model = world_model
        self.train_tasks, self.eval_tasks = list(train_tasks), list(eval_tasks)
        self.executor = executor
        self.mode = mode
        self.prompt_style = prompt_style
        self.timeout_s = timeout_s
        self.max_prompt_tokens = max_prompt_tokens
        self.eval_samples_per_task = eval_samples_per_task
        self.eval_seed = eval_seed
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)
        # Data-parallel sharded generation: how each rank's extras are padded to the longest share
        # (prompts are left-padded; the search constraint's allowed ids are -1 padded).
        self.extras_padding = {
            "prompt_ids": ("left", policy.tokenizer.pad_token_id),
            "prompt_mask": ("left", 0),
            EXTRA_ALLOWED: ("right", -1),
        }
        # Scores that evaluate() reports alongside the current policy's (e.g. the SFT policy's).
        self.reference_scores = dict(reference_scores or {})
        self._start_eval: tuple[str, dict[str, float]] | None = None  # remember_start_evaluation
        # Figures measured while building (SFT validity, WM quality, ...); see pipeline.build_domain.
        self.build_info: dict[str, Any] = {}
        self._prior_groups = prior_groups
        self._outcomes: Counter[str] = Counter()  # training's execution outcomes so far (step_metrics)

    # ---- rollouts --------------------------------------------------------------------------------
    def _pool(self, split: str) -> list[Any]:
        if split == "train":
            return self.train_tasks
        if split in ("eval", "heldout"):
            return self.eval_tasks
        raise ValueError(f"unknown split {split!r}; expected 'train', 'eval' or 'heldout'")

    def shard_rng(self, rank: int, step: int) -> None:
        """Data-parallel ``generation="shard"`` (wmrl/distributed.py), before each step's generation:
        reseed the sampling generator from ``(seed, step, rank)`` (independent edits per rank; a
        resumed run draws what an uninterrupted one drew)."""
        from wmrl.distributed import shard_seed

        self.gen.manual_seed(shard_seed(self.seed, step, rank))

    def sample_tasks(self, n: int, split: str, generator: torch.Generator) -> list[Any]:
        pool = self._pool(split)
        idx = torch.randint(len(pool), (n,), generator=generator)
        return [pool[i] for i in idx.tolist()]

    def rollouts(
        self, tasks: Sequence[Any], group_size: int, generator: torch.Generator, greedy: bool = False
    ) -> RolloutBatch:
        """``group_size`` sampled edits per task, applied (or rejected) against each baseline."""
        prompts = [build_prompt(t, t.baseline_source, self.mode, self.prompt_style) for t in tasks]
        ids, mask = self.policy.encode(prompts, self.max_prompt_tokens)  # [n, P]
        ids, mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)  # [N, P]
        # knobs mode: the rows' sources, for the policy's search constraint (ignored when it is off)
        sources = (
            [t.baseline_source for t in tasks for _ in range(group_size)] if self.mode == "knobs" else None
        )
        spaces = [t.knob_space for t in tasks for _ in range(group_size)] if self.mode == "knobs" else None
        s = self.policy.sample(ids, mask, generator, greedy=greedy, sources=sources, knob_spaces=spaces)
        payload = []
        for j, text in enumerate(s.texts):
            t = tasks[j // group_size]
            res = apply_edits(t.baseline_source, text, self.mode)
            payload.append(EditRollout(t.id, text, res.source, res.reason))
        return RolloutBatch(
            tokens=s.tokens,
            logprobs=s.logprobs,
            mask=s.mask,
            group_ids=torch.arange(len(tasks)).repeat_interleave(group_size),
            tasks=list(tasks),
            payload=payload,
            extras={"prompt_ids": ids, "prompt_mask": mask, **s.extras()},
        )

    def generate(self, tasks: Sequence[Any], group_size: int, anchor_groups: torch.Tensor) -> RolloutBatch:
        return self.rollouts(tasks, group_size, self.gen)

    def prior_anchor_groups(self) -> PriorGroups | None:
        """The SFT-sample execution log as anchor groups (``ppi.prior_from_log``;
        :func:`wmrl_research.pipeline.prior_anchor_groups`), None when the build made none."""
        return self._prior_groups

    def execution_jobs(self, batch: RolloutBatch, indices: Sequence[int]) -> list[Job]:
        from wmrl_research.grading import graded_reward

        jobs = []
        for i in indices:
            p = batch.payload[int(i)]
            if p.applied:
                jobs.append(Job(fn=graded_reward, args=(p.task_id, p.source, self.timeout_s)))
            else:
                jobs.append(Job(fn=rejected_job, args=()))
        return jobs

    def _run(self, batch: RolloutBatch, indices: Sequence[int] | None) -> tuple[torch.Tensor, list[str]]:
        """True rewards ``[len(indices)]`` through the executor (NaN where ungraded) and each
        execution's outcome: the sandbox's status, ``"rejected"`` (the edit did not apply: the
        failure score without a run) or ``"ungraded"`` (the job itself failed)."""
        idx = list(range(batch.n_rollouts)) if indices is None else [int(i) for i in indices]
        results = self.executor.run(self.execution_jobs(batch, idx))
        outcomes = [(r.outcome or "ok") if r.ok else "ungraded" for r in results]
        return torch.tensor([r.reward for r in results], dtype=torch.float32), outcomes

    def execute(self, batch: RolloutBatch, indices: Sequence[int] | None = None) -> torch.Tensor:
        """True rewards ``[len(indices)]`` as training's executions (NaN where ungraded): their
        outcomes go to :meth:`execution_outcomes`, as the trainer's do."""
        r, outcomes = self._run(batch, indices)
        self.execution_outcomes([o for o in outcomes if o != "ungraded"])
        return r

    def execution_outcomes(self, outcomes: list[str]) -> None:
        """Count training's execution outcomes (the sandbox's statuses, ``"rejected"``) for
        :meth:`step_metrics`, and warn about executions stopped at the wall-clock limit (on a loaded
        machine their failure score may be the machine's)."""
        self._outcomes.update(outcomes)
        if n := outcomes.count("timeout"):
            log.warning(
                "%d of %d executions hit the sandbox's %g s wall-clock limit and earned the failure "
                "score; on a loaded machine that may be the machine, not the solution "
                "(--domain.sandbox_timeout_s raises the limit)", n, len(outcomes), self.timeout_s,
            )  # fmt: skip

    def step_metrics(self) -> dict[str, float]:
        """Training's executions so far by outcome, ``exec_<outcome>`` for each sandbox status and
        ``rejected`` (logged as ``domain/exec_timeout`` ...; a checkpoint keeps them)."""
        return {f"exec_{o}": float(self._outcomes.get(o, 0)) for o in EXECUTION_OUTCOMES}

    def rollout_media(
        self, batch: RolloutBatch, predicted: torch.Tensor | None, true: torch.Tensor, max_rows: int = 64
    ) -> dict:
        """wandb media of a step: a table of the first ``max_rows`` edits (task, group, completion,
        applied or why not, the WM's predicted score, the true score where executed)."""
        from wmrl.tracking import Table, table_value

        rows = []
        for i, p in enumerate(batch.payload[:max_rows]):
            rows.append(
                [
                    p.task_id,
                    int(batch.group_ids[i]),
                    p.completion,
                    p.applied,
                    p.reason,
                    None if predicted is None else table_value(predicted[i]),
                    table_value(true[i]),
                ]
            )
        columns = ["task", "group", "edit", "applied", "reason", "predicted", "true"]
        return {"rollouts/edits": Table(columns, rows)}

    # ---- evaluation ------------------------------------------------------------------------------
    def remember_start_evaluation(self, scores: dict[str, float]) -> None:
        """The held-out evaluation of the policy as built (cached with its checkpoint): while the
        policy's parameters are unchanged, ``evaluate("eval")`` returns it without executing (a run's
        step-0 evaluation, which would repeat the same executions)."""
        self._start_eval = (parameter_digest(self.policy), dict(scores))

    @torch.no_grad()
    def evaluate(self, split: str = "eval") -> dict[str, float]:
        """Real-execution scores on every task of ``split``: ``eval_samples_per_task`` samples each,
        from a fixed seed. Keys: ``score_mean`` (normalised), ``runnable_frac`` (graded above the
        failure score), ``apply_frac``, ``score/<task>``; plus the baseline (0 by construction of
        the normalised score) and any reference scores (e.g. ``sft_score_mean``)."""
        start = self._start_eval
        if split == "eval" and start is not None and parameter_digest(self.policy) == start[0]:
            return {**start[1], **self.reference_scores}
        tasks = self._pool(split)
        gen = torch.Generator().manual_seed(self.eval_seed)
        batch = self.rollouts(tasks, self.eval_samples_per_task, gen)
        r, outcomes = self._run(batch, None)
        graded = torch.isfinite(r)
        out = {
            "score_mean": float(r[graded].mean()) if graded.any() else float("nan"),
            "runnable_frac": float((r[graded] > FAILURE_SCORE).float().mean()) if graded.any() else 0.0,
            "apply_frac": float(sum(p.applied for p in batch.payload) / batch.n_rollouts),
            "ungraded_frac": float((~graded).float().mean()),
            "timeout_frac": outcomes.count("timeout") / len(outcomes),
            "baseline_score_mean": 0.0,
        }
        k = self.eval_samples_per_task
        for g, t in enumerate(tasks):
            rg = r[g * k : (g + 1) * k]
            rg = rg[torch.isfinite(rg)]
            out[f"score/{t.id}"] = float(rg.mean()) if rg.numel() else float("nan")
        out.update(self.reference_scores)
        return out

    def oracle_rewards(self, batch: RolloutBatch) -> torch.Tensor | None:
        return None

    # ---- resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "world_model": self.world_model.state_dict(),
            "gen": self.gen.get_state(),
            "outcomes": dict(self._outcomes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.world_model.load_state_dict(state["world_model"])
        self.gen.set_state(state["gen"])
        self._outcomes = Counter(state.get("outcomes", {}))  # checkpoints before the counts: none

    def close(self) -> None:
        """Stop the evaluation executor's workers (and their sandboxes). Without it a process that
        built the domain, e.g. a grid's worker, cannot exit: its pool's children are still joined."""
        self.executor.close()
