"""VLA domain config: its fields and checks (``wmrl_vla.plugin`` registers it as ``vla``). Light to import.

``build`` runs the whole preparation, each stage cached on disk under ``cache_dir`` keyed by the
fields it depends on, so a second run (or another method from the same SFT checkpoint) reuses them:
record expert demos (LeRobot dataset) -> SFT of the policy -> world-model pretraining.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wmrl.config import ConfigError, DomainConfig, did_you_mean
from wmrl_vla.chain_config import DenoisingChainConfig
from wmrl_vla.lerobot_env import LeRobotEnvConfig
from wmrl_vla.policies import POLICY_KINDS, check_policy_path, policy_kind

OWN_TASKS_DEFAULT = ["wmrl/ReachColor-v0", "wmrl/PushColor-v0", "wmrl/PressButton-v0"]
# The registered policy kinds (wmrl_vla/policies/), the choices of domain.policy.
POLICIES = tuple(POLICY_KINDS)
WORLD_MODELS = ("deterministic", "diffusion")
IMAGINE_INPUTS = ("pixels", "latent", "first_frame")
# What the world model's state and outcome heads read (world_models.vla_dynamics.OUTCOME_INPUTS).
WM_OUTCOMES = ("latent", "state")
# What the grounded outcome heads read besides the state (world_models.vla_dynamics.OUTCOME_READS).
WM_OUTCOME_READS = ("scene", "geometry")
# The offline dataset's default sources (wmrl_vla/offline_data.py): noisy experts at four scales (at
# sigma 1.0 and 1.5 they fail a quarter and half the time on vla-rl's tasks: the near-misses), the SFT
# policy cooler and hotter than it samples during RL, and two perturbed copies of it (docs/results/vla.md).
WM_OFFLINE_MIX = ["expert:0.3", "expert:0.6", "expert:1.0", "expert:1.5", "policy:0.5", "policy:1.5",
                  "perturbed:0.05", "perturbed:0.15"]  # fmt: skip


@dataclass
class VLAEvaluation:
    """How :class:`wmrl_vla.domain.VLADomain` evaluates the policy on held-out episodes: the
    ``domain.eval_*`` fields and ``n_videos`` of :class:`VLAConfig` (documented there), grouped for the
    domain's constructor (:attr:`VLAConfig.evaluation`)."""

    temperature: float = 1.0
    sampled: bool = False
    episodes_per_task: int = 10
    combos: str = "test"
    lockstep: int = 64
    n_videos: int = 2


@dataclass
class VLAWMRefinement:
    """How :class:`wmrl_vla.world_model.VLAWorldModel` refines the world model on each step's anchors:
    :class:`VLAConfig`'s ``wm_update_steps``, ``wm_update_lr`` and ``wm_calibrate``, with the training
    windows pretraining uses too (``wm_batch_size``, ``wm_horizon``, ``wm_state_horizon``), grouped for
    its constructor (:attr:`VLAConfig.wm_refinement`)."""

    update_steps: int = 20
    lr: float = 3e-4
    batch_size: int = 32
    horizon: int = 8
    state_horizon: int = 50
    calibrate: bool = True


@dataclass
class VLAConfig(DomainConfig):
    HELDOUT_SCORE, HELDOUT_SIZE = "success", "eval_episodes_per_task"
    # Task ids (see `wmrl tasks vla`); tasks must share action and state dims. Any MetaWorld v3 task
    # is wmrl/MetaWorld-<name> (e.g. wmrl/MetaWorld-dial-turn-v3), its expert MetaWorld's own policy.
    tasks: list[str] = field(default_factory=lambda: list(OWN_TASKS_DEFAULT))
    # Side of the square camera image.
    image_size: int = 64
    # Override every task's time limit (env steps); null keeps each task's own (`wmrl tasks vla`).
    # Shorter than a task's expert needs, the demos fail: no successful demo of a task is an error.
    max_steps: int | None = None
    # Scripted-expert demonstrations per task (seeds demo_seed, demo_seed + 1, ...).
    demos_per_task: int = 40
    demo_seed: int = 0
    # Instruction/colour combinations the demos are drawn from: "train" keeps the ones evaluation
    # holds out ("test") out of SFT; "all" (the old behaviour) leaks about a quarter of the demos
    # onto them.
    demo_split: str = "train"
    # Where demos, SFT and WM checkpoints are cached (shared across runs and methods).
    cache_dir: str = "runs/cache/vla"
    # Policy: "small_vla" (discretised action tokens, trained from scratch) | "lerobot_act" (lerobot's
    # ACT, random init, with a learnable Gaussian head: see wmrl_vla.lerobot_bridge) |
    # "lerobot_smolvla" (lerobot's SmolVLA built offline around a tiny random SmolVLM, the
    # instruction fed in, same Gaussian head: see wmrl_vla.smolvla_bridge) | "lerobot_diffusion"
    # (lerobot's DiffusionPolicy, small, random init, cloned with its diffusion loss; GRPO through its
    # denoising chain's log-probability: see wmrl_vla.diffusion_bridge) | "lerobot_smolvla_chain"
    # (lerobot_smolvla, same SFT, acting by a stochastic flow chain with an exact log-probability:
    # see SmolVLAFlowChainPolicy). d_model and n_layers size all but lerobot_diffusion (SmolVLA: its
    # text tower's width and depth, at least 2 layers).
    policy: str = "small_vla"
    # A policy trained with lerobot (its `pretrained_model` folder, or a hub id): post-trained as is
    # (no SFT; domain.policy becomes the folder's kind, lerobot_act, lerobot_smolvla or
    # lerobot_diffusion), its inputs through its own saved processors. ACT, SmolVLA or diffusion
    # (n_obs_steps=1); see wmrl_vla.lerobot_policy and wmrl_vla.diffusion_bridge.
    policy_path: str | None = None
    # How lerobot_diffusion's denoising chain is executed and scored (--domain.chain.act_steps=4 runs
    # 4 chunk positions open loop per chain): wmrl_vla/chain_config.py.
    chain: DenoisingChainConfig = field(default_factory=DenoisingChainConfig)
    # An env lerobot knows, as lerobot spells it (--domain.env.type=metaworld
    # --domain.env.task=reach-v3); it replaces domain.tasks. See wmrl_vla.lerobot_env.
    env: LeRobotEnvConfig = field(default_factory=LeRobotEnvConfig)
    # The user's LeRobotDataset folder (recorded in that env): the world model pretrains on it (plus
    # the policy's rollouts) instead of demos recorded by a scripted expert.
    dataset_root: str | None = None
    n_bins: int = 21
    d_model: int = 64
    n_layers: int = 2
    # SmallVLA's full-resolution target locator (wmrl_vla.vision.TargetLocator), trained by the
    # sft_aux_goal loss on labels from the simulator.
    locator: bool = True
    # Behaviour cloning.
    sft_epochs: int = 20
    sft_batch_size: int = 64
    sft_lr: float = 1e-3
    # Random image shift (pixels) and weight of the auxiliary "where does the demo's hand end up"
    # loss on the image encoder's keypoint token (see wmrl_vla.sft.SFTConfig).
    sft_shift: int = 0
    sft_aux_goal: float = 0.0
    # DAgger after behaviour cloning: rounds of (roll out the policy greedily on training seeds and
    # combinations, label every visited frame with the scripted expert's action, fine-tune on demos
    # + all relabelled frames for dagger_epochs). 0 = plain behaviour cloning.
    dagger_rounds: int = 0
    dagger_episodes_per_task: int = 20
    dagger_epochs: int = 6
    # Sampling temperature of the policy during RL rollouts, and at evaluation (0: greedy, each action
    # dimension's most likely bin).
    temperature: float = 1.0
    eval_temperature: float = 1.0
    # Also evaluate the policy sampled at `temperature` (the one GRPO trains) on the same episodes,
    # as eval/success_sampled (and reward_sampled, success_sampled/<task>): a grid can fix greedy
    # and sampled success in advance, or score on either (its spec's `score`). Doubles evaluation.
    eval_sampled: bool = False
    # World model: frame decoder "deterministic" | "diffusion", ensemble size, pretraining.
    world_model: str = "deterministic"
    wm_members: int = 3
    wm_latent_dim: int = 128
    # Hash buckets of the instruction's words the WM's latent is conditioned on (FiLM on its frame
    # features): which object a task names is in the instruction alone. 0: an unconditioned WM (the
    # WM of the figures measured before this field existed).
    wm_instruction_buckets: int = 256
    # What the WM's state and outcome heads read: "latent" (the latent rolled forward, which drifts
    # past its training window and then scores long, failing episodes highest) or "state"
    # (proprioception rolled forward next to the named object's table xy as the simulator placed it
    # at reset: world_models.vla_dynamics.GroundedMember).
    wm_outcome: str = "latent"
    # With wm_outcome=state: the grounded members keep a learned integrator of the actions (the hand's
    # position target, which an action moves and the hand follows), so the rolled hand need not drift.
    wm_integrator: bool = False
    # With wm_outcome=state, what the outcome heads read besides the state: "scene" (the task
    # embedding of the first frame's latent, which can tell the training episodes apart and learn
    # their outcomes by heart) or "geometry" (the hand's offset to the named object and its height in
    # centimetres, the task from the instruction's words: needs wm_instruction_buckets > 0).
    wm_outcome_reads: str = "scene"
    # Real rollouts of the SFT policy per task added to the WM's pretraining data (demos never fail).
    wm_policy_rollouts_per_task: int = 16
    # A policy-diverse offline dataset for the WM's pretraining (wmrl_vla/offline_data.py): this many
    # episodes per task, dealt round-robin to the sources of wm_offline_mix (`expert:σ` = the scripted
    # expert with action noise σ, `policy:T` = the SFT policy at temperature T, `perturbed:α` = the SFT
    # policy with its weights moved by α of their std), recorded once per machine as a LeRobot dataset
    # shared by every seed and method; its simulator steps are reported apart from the RL budget
    # (offline_data.json in the run directory). 0: none.
    wm_offline_per_task: int = 0
    wm_offline_mix: list[str] = field(default_factory=lambda: list(WM_OFFLINE_MIX))
    wm_train_steps: int = 1500
    wm_batch_size: int = 32
    # Open-loop training window (steps); and that of the grounded heads (wm_outcome=state), which
    # decode no frame, so whole episodes are cheap.
    wm_horizon: int = 8
    wm_state_horizon: int = 50
    wm_lr: float = 1e-3
    # Online refinement: Adam steps on the replay (demos + anchors) after each step's anchors.
    wm_update_steps: int = 20
    wm_update_lr: float = 3e-4
    diffusion_steps: int = 4
    # Calibrate the ensemble's variance (predict's var = a * var + b): fitted on held-out episodes at
    # pretraining, refitted on every step's anchors before the WM trains on them.
    wm_calibrate: bool = True
    # Imagine a twin group for every anchor group with the same sampling noise as its real rollouts
    # (common random numbers), for `ppi`'s task-level correction (RolloutBatch.real_row); other
    # methods ignore it.
    twin_anchors: bool = False
    # What the policy sees in imagination: "pixels" (frames decoded by the world model, the pixel
    # encoder as in the simulator) | "latent" (the WM latent through a small adapter distilled from
    # the pixel encoder, no frame decoded: several times faster imagination; small_vla only; see
    # wmrl_vla/latent.py) | "first_frame" (the task's real first frame at every step, with the
    # proprioception the WM predicts: no frame decoded, the arm's motion reaches the policy through
    # its state alone). latent_adapter_steps: distillation steps at build time;
    # latent_refresh_steps: distillation steps after every imagined batch (on its own latents).
    imagine_input: str = "pixels"
    latent_adapter_steps: int = 500
    latent_refresh_steps: int = 5
    # Anchor jobs re-simulate the recorded actions from the seed (a second real execution) instead
    # of returning the reward recorded while the anchor rollout was generated.
    regrade: bool = False
    # Append anchor rollouts to a LeRobot dataset in the run directory (written in a process of its
    # own beside the training; a checkpoint waits for it).
    record_anchors: bool = True
    # Held-out evaluation: episodes per task, GIFs saved per evaluation.
    eval_episodes_per_task: int = 10
    # Instruction/colour combinations of the held-out episodes (always on held-out seeds): "test"
    # holds out the combinations that SFT and GRPO never see; "train" evaluates on the combinations
    # they train on (does RL improve the tasks it trains on, apart from composing new ones?).
    eval_combos: str = "test"
    # Evaluation episodes simulated in lockstep (batched through the policy). Each holds a MuJoCo
    # env and renderer (~20 MB), so this bounds evaluation memory: 400 at once peaked at 11.4 GB, 64 at 4.3 GB
    # (benchmarks/vla_eval_memory.py).
    eval_lockstep: int = 64
    # Simulated training rollouts (anchor groups' rollouts) stepped in lockstep at once, each with its
    # env and renderer; null: all of a step's at once (a `real` step of 8 groups of 8 holds 64). A
    # bound runs them in chunks of at most this many rollouts (a group may straddle two chunks: same
    # tasks and seeds, the sampling generator drawn in another order) and caps the envs the run holds
    # at max(rollout_lockstep, eval_lockstep): lerobot's MetaWorld env holds about 0.16 GB
    # (benchmarks/results/vla_rollout_memory.json; docs/vla.md).
    rollout_lockstep: int | None = None
    n_videos: int = 2

    @property
    def evaluation(self) -> VLAEvaluation:
        """The held-out evaluation's fields as one object (they stay flat on the command line:
        ``--domain.eval_episodes_per_task`` and the rest, as committed specs and run dirs spell them)."""
        return VLAEvaluation(
            temperature=self.eval_temperature, sampled=self.eval_sampled, episodes_per_task=self.eval_episodes_per_task,
            combos=self.eval_combos, lockstep=self.eval_lockstep, n_videos=self.n_videos,
        )  # fmt: skip

    @property
    def wm_refinement(self) -> VLAWMRefinement:
        """The WM's online refinement fields as one object (flat on the command line, as ``evaluation``)."""
        return VLAWMRefinement(
            update_steps=self.wm_update_steps, lr=self.wm_update_lr, batch_size=self.wm_batch_size,
            horizon=self.wm_horizon, state_horizon=self.wm_state_horizon, calibrate=self.wm_calibrate,
        )  # fmt: skip

    def bf16_unsupported(self) -> str | None:
        """A lerobot policy runs in float32 only (``--precision=bf16`` is refused when parsed)."""
        if not policy_kind(self).lerobot:
            return None
        setting = (
            f"domain.policy_path={self.policy_path}" if self.policy_path else f"domain.policy={self.policy}"
        )
        return f"{setting} (a lerobot policy) is run in float32 only"

    def __post_init__(self) -> None:
        self._resolve_sources()
        self._check_tasks()
        self._check_policy()
        self._check_world_model()
        self._check_sampling()

    def _resolve_sources(self) -> None:
        """The lerobot env (it replaces ``tasks``), the user's policy folder (it sets ``policy``) and
        dataset, each checked before anything is built."""
        if isinstance(self.env, dict):  # from a YAML preset
            self.env = LeRobotEnvConfig(**self.env)
        if self.env.type is not None:
            from wmrl_vla.lerobot_env import register_task

            try:
                self.tasks = [register_task(self.env)]
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if self.policy_path is not None:
            from wmrl_vla.lerobot_policy import PolicyPathError

            try:
                kind = check_policy_path(self.policy_path, self.image_size)
            except PolicyPathError as e:
                raise ConfigError(str(e)) from None
            # record the kind of policy the run post-trains (config.yaml), not the unused default
            used = f"lerobot_{kind}"
            if self.policy not in ("small_vla", used):
                raise ConfigError(
                    f"domain.policy={self.policy} but domain.policy_path={self.policy_path} holds a "
                    f"{kind!r} policy; drop domain.policy (the folder sets it: {used})"
                )
            self.policy = used
        if self.dataset_root is not None:
            from wmrl_vla.lerobot_env import check_dataset

            try:
                check_dataset(self.dataset_root)
            except ValueError as e:
                raise ConfigError(str(e)) from None

    def _check_tasks(self) -> None:
        if not self.tasks:
            raise ConfigError("domain.tasks is empty; list task ids (see `wmrl tasks vla`)")
        from sims.registry import TASKS, all_task_ids, close_names, unknown_task_message

        # checked here, before anything is built; MetaWorld is imported only for ids outside TASKS
        for task_id in self.tasks:
            if task_id not in TASKS and unknown_task_message(task_id) is not None:
                known = all_task_ids()
                close = close_names(task_id, known)
                raise ConfigError(
                    f"domain.tasks: unknown task id {task_id!r}{did_you_mean(task_id, known)}"
                    f"{' (close: ' + ', '.join(close) + ')' if len(close) > 1 else ''}; any MetaWorld v3 "
                    f"task is wmrl/MetaWorld-<name>, e.g. wmrl/MetaWorld-dial-turn-v3 (`wmrl tasks vla` "
                    f"lists the {len(known)} ids)"
                )
        self._check_task_specs()

    def _check_policy(self) -> None:
        """The policy kind, what it sees in imagination, its demos and behaviour cloning."""
        if self.policy not in POLICIES:
            raise ConfigError(f"domain.policy={self.policy!r} is not one of {', '.join(POLICIES)}")
        if isinstance(self.chain, dict):  # from a YAML preset
            self.chain = DenoisingChainConfig(**self.chain)
        self.chain.check(self.policy, "lerobot_diffusion")
        if self.imagine_input not in IMAGINE_INPUTS:
            raise ConfigError(
                f"domain.imagine_input={self.imagine_input!r} is not one of {', '.join(IMAGINE_INPUTS)}"
            )
        if self.imagine_input == "latent" and not policy_kind(self).reads_latent:
            raise ConfigError(
                f"domain.imagine_input=latent needs domain.policy=small_vla (the latent adapter predicts "
                f"its visual features), not {self.policy}; use domain.imagine_input=pixels"
            )
        if self.latent_adapter_steps < 1 or self.latent_refresh_steps < 0:
            raise ConfigError(
                f"domain.latent_adapter_steps={self.latent_adapter_steps} must be >= 1 and "
                f"domain.latent_refresh_steps={self.latent_refresh_steps} >= 0"
            )
        if self.image_size % 16 != 0:
            raise ConfigError(f"domain.image_size={self.image_size} must be a multiple of 16")
        if self.demo_split not in ("train", "all"):
            raise ConfigError(f"domain.demo_split={self.demo_split!r} is not one of train, all")
        if self.demos_per_task < 1:
            raise ConfigError(f"domain.demos_per_task={self.demos_per_task} must be >= 1")
        if self.dagger_rounds < 0 or self.dagger_episodes_per_task < 1 or self.dagger_epochs < 1:
            raise ConfigError(
                f"domain.dagger_rounds={self.dagger_rounds} must be >= 0, dagger_episodes_per_task="
                f"{self.dagger_episodes_per_task} and dagger_epochs={self.dagger_epochs} >= 1"
            )

    def _check_world_model(self) -> None:
        if self.world_model not in WORLD_MODELS:
            raise ConfigError(
                f"domain.world_model={self.world_model!r} is not one of {', '.join(WORLD_MODELS)}"
            )
        if self.wm_members < 1:
            raise ConfigError(f"domain.wm_members={self.wm_members} must be >= 1")
        if self.wm_instruction_buckets < 0:
            raise ConfigError(f"domain.wm_instruction_buckets={self.wm_instruction_buckets} must be >= 0")
        if self.wm_offline_per_task < 0:
            raise ConfigError(f"domain.wm_offline_per_task={self.wm_offline_per_task} must be >= 0")
        from wmrl_vla.offline_data import parse_mix

        try:
            parse_mix(self.wm_offline_mix)
        except ValueError as e:
            raise ConfigError(f"domain.wm_offline_mix: {e}") from None
        if self.wm_outcome not in WM_OUTCOMES:
            raise ConfigError(f"domain.wm_outcome={self.wm_outcome!r} is not one of {', '.join(WM_OUTCOMES)}")
        if self.wm_integrator and self.wm_outcome != "state":
            raise ConfigError("domain.wm_integrator=true needs domain.wm_outcome=state (it rolls the state)")
        if self.wm_outcome_reads not in WM_OUTCOME_READS:
            raise ConfigError(
                f"domain.wm_outcome_reads={self.wm_outcome_reads!r} is not one of {', '.join(WM_OUTCOME_READS)}"
            )
        if self.wm_outcome_reads == "geometry" and (
            self.wm_outcome != "state" or not self.wm_instruction_buckets
        ):
            raise ConfigError(
                "domain.wm_outcome_reads=geometry needs domain.wm_outcome=state and "
                f"domain.wm_instruction_buckets > 0 (got {self.wm_outcome!r}, {self.wm_instruction_buckets})"
            )

    def _check_sampling(self) -> None:
        """Sampling temperatures and the held-out evaluation."""
        if self.eval_lockstep < 1:
            raise ConfigError(f"domain.eval_lockstep={self.eval_lockstep} must be >= 1")
        if self.rollout_lockstep is not None and self.rollout_lockstep < 1:
            raise ConfigError(
                f"domain.rollout_lockstep={self.rollout_lockstep} must be >= 1 (or null: all of a step's "
                "simulated rollouts at once)"
            )
        if self.eval_combos not in ("test", "train"):
            raise ConfigError(f"domain.eval_combos={self.eval_combos!r} is not one of test, train")
        if self.temperature <= 0 or self.eval_temperature < 0:
            raise ConfigError(
                f"domain.temperature={self.temperature} must be > 0 and "
                f"domain.eval_temperature={self.eval_temperature} >= 0"
            )
        if self.eval_sampled and self.eval_temperature == self.temperature:
            raise ConfigError(
                f"domain.eval_sampled=true with domain.eval_temperature equal to domain.temperature "
                f"({self.temperature}): the evaluation already samples the policy GRPO trains; set "
                "eval_temperature=0 for greedy and sampled both, or drop eval_sampled"
            )

    def _check_task_specs(self) -> None:
        """Every task has a scripted expert (demonstrations come from it) and all share state and
        action dims (one policy acts in all)."""
        from sims.registry import get

        specs = [get(t) for t in self.tasks]
        no_expert = [s.task_id for s in specs if s.expert is None]
        if no_expert:
            raise ConfigError(
                f"domain.tasks: {', '.join(no_expert)} {'has' if len(no_expert) == 1 else 'have'} no "
                "scripted expert to record demonstrations from; choose tasks with one (`wmrl tasks vla` "
                "says which have an expert)"
            )
        if len({(s.state_dim, s.action_dim) for s in specs}) > 1:
            dims = ", ".join(f"{s.task_id} state {s.state_dim} action {s.action_dim}" for s in specs)
            raise ConfigError(
                f"domain.tasks must share state and action dims (one policy acts in all): {dims}; "
                "train such tasks in separate runs"
            )

    @classmethod
    def task_lines(cls) -> list[str]:
        import sims

        return sims.task_lines(all_metaworld=True)
