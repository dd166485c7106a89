"""The controlled problem: a contextual bandit where the true reward, the WM's bias and its noise are known.

``n_contexts`` contexts, ``n_actions`` actions each, a true reward ``r[k, a]`` in [0, 1], and a
softmax policy ``pi(a | k) = softmax(theta[k])``. A rollout is one action token. The world model's
score is

    r_hat[k, a] = g(r[k, a] + sigma[k, a] * xi),      xi ~ N(0, 1) fresh at every query
    g(x) = tanh(s * x) / tanh(s),  s = 4 * bias_strength

The WM's internal estimate is noisy, and its output *saturates* (as a squashing output head does):
``g`` is monotone but not affine, it squeezes the good actions' scores together and inflates the
weak ones', so uncalibrated within-group advantages have the wrong sizes. A monotone calibration can
undo it (``f = g^-1`` gives back ``r + noise``). In a share ``rank_error_frac`` of the contexts the
WM also swaps the best action with a median one, a ranking error that no monotone map fixes and
only real rewards correct. The noise is heteroscedastic, ``sigma[k, a] = noise * (0.25 + 1.5 *
u[k, a])``, and the WM reports its variance (``(g'(r) * sigma)^2``, the delta method). The WM is
fixed (it does not learn), so what the corrections achieve is plain to see.

It implements the Domain protocol and runs through the real trainer, anchors, debiaser and denoiser.
The config is here; the problem, policy, world model and domain are in wmrl/toy_domain.py (torch),
imported when a run builds the domain and readable from here too (``from wmrl.toy import ToyDomain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wmrl.config import ConfigError, DomainConfig, RunConfig

if TYPE_CHECKING:
    from wmrl.toy_domain import ToyDomain


@DomainConfig.register_subclass("toy")
@dataclass
class ToyConfig(DomainConfig):
    HELDOUT_SCORE = "true_reward"  # exact expected reward over every context (no sampling)
    HAS_EXECUTION_LOG = True  # `log_groups` groups of the starting policy (ppi.prior_from_log)
    # The default non-inferiority margin on the true reward, and the domain's name for people
    # (wmrl.domain.DomainConfigCapabilities).
    NONINFERIORITY_MARGIN = 0.005
    DISPLAY_NAME = "toy"
    n_contexts: int = 64
    n_actions: int = 8
    # Seed of the problem itself (rewards, distortion, noise levels): fixed across run seeds.
    problem_seed: int = 1234
    # Saturation of the WM's output g(x) = tanh(4 b x) / tanh(4 b); 0 is no distortion.
    bias_strength: float = 1.0
    # Share of contexts whose best action the WM ranks below a mediocre one.
    rank_error_frac: float = 0.2
    # Base scale of the heteroscedastic WM noise.
    noise: float = 0.25
    # Seconds a real execution sleeps, to emulate an expensive environment (0: free).
    exec_cost_s: float = 0.0
    # Append an imagined twin group for each anchor task (the task-level form of `ppi`, as a domain
    # whose WM rollouts are not its real ones does), drawn with common random numbers (the twin's
    # rollout j reuses rollout j's sampling noise: the same action, as the policy is the same) or not.
    twin_anchors: bool = False
    twin_common_noise: bool = True
    # Groups of the starting policy executed and WM-scored before training, as a real domain's
    # pre-training execution log (used by ppi.prior_from_log only).
    log_groups: int = 8

    def __post_init__(self) -> None:
        if self.n_contexts < 1 or self.n_actions < 2:
            raise ConfigError(
                f"domain.n_contexts={self.n_contexts} must be >= 1 and domain.n_actions={self.n_actions} >= 2"
            )
        if not 0 <= self.rank_error_frac <= 1:
            raise ConfigError(f"domain.rank_error_frac={self.rank_error_frac} must lie in [0, 1]")
        if self.log_groups < 1:
            raise ConfigError(f"domain.log_groups={self.log_groups} must be >= 1")
        if self.bias_strength < 0 or self.noise < 0:
            raise ConfigError(
                f"domain.bias_strength={self.bias_strength} and domain.noise={self.noise} must be >= 0"
            )

    def build(self, run: RunConfig) -> ToyDomain:
        from wmrl.toy_domain import ToyDomain

        return ToyDomain(self, seed=run.seed, group_size=run.grpo.group_size)

    @classmethod
    def task_lines(cls) -> list[str]:
        cfg = cls()
        return [f"toy/context-{k}\ttoy\t{cfg.n_actions} actions" for k in range(cfg.n_contexts)]


def __getattr__(name: str) -> Any:
    """``wmrl.toy.ToyDomain``, ``SoftmaxPolicy``, ...: the names of wmrl/toy_domain.py, imported on
    first use."""
    import wmrl.toy_domain

    try:
        return getattr(wmrl.toy_domain, name)
    except AttributeError:
        raise AttributeError(f"module 'wmrl.toy' has no attribute {name!r}") from None
