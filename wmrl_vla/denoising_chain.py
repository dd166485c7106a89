"""The log-probability of an action sampled by a denoising chain (diffusion or flow matching).

A diffusion or flow-matching policy turns noise into an action chunk in ``K`` steps. Its action's
density is intractable, but made stochastic at every step (DPPO, arXiv:2409.00588; ReinFlow,
arXiv:2505.22094; piRL, arXiv:2510.25889) the *chain* ``x^0 -> x^1 -> ... -> x^K`` (noise first,
the action chunk last) is a Markov chain of Gaussians whose joint density is exact::

    log p_theta(x^0..x^K | o) = log N(x^0; 0, I) + sum_k log N(x^{k+1}; m_theta(x^k, k, o), s_k^2 I)

Recorded with a rollout, the same chain is re-scored under new parameters for the ratio
``exp(log p_new - log p_old)`` of the clipped-ratio loss (the action is a function of the chain, so
this is the policy gradient of the chain-level MDP DPPO describes). The step means and spreads:

* **DDPM** (lerobot's DiffusionPolicy, diffusers' ``DDPMScheduler``): ``m`` is the posterior mean
  ``q(x_{t'} | x_t, x0_hat)`` of :func:`ddpm_step_mean` and ``s_k`` its ``fixed_small`` standard
  deviation (:func:`ddpm_step_std`), floored at ``min_std`` so that every step (the last one
  included, which DDPM leaves noiseless) explores and has a density.
* **Flow matching** (SmolVLA): a stochastic Euler step ``x + v_theta(x, t) dt + sigma sqrt(|dt|) eps``
  (:func:`euler_step_mean`, std ``sigma sqrt(|dt|)``).

Which terms a token scores (:func:`scored_chain_log_prob`, ``scoring``): the joint density of the
whole chain (``"joint"``), or only what the executed chunk positions depend on: the exact marginal
that integrates out the final step of the unexecuted positions (``"executed_marginal"``), or DPPO's
heuristic that keeps the executed positions alone at every step (``"executed_only"``, biased).
Fine-tuning only the last ``K'`` steps (DPPO's ``ft_denoising_steps``; the first ``K - K'`` from a
frozen base policy) scores only those ``K'`` steps' terms (``ft_steps``), exact for the ratio.

Shapes: a batch of ``B`` chains over action chunks of ``H`` steps and ``A`` dims is
``chain [B, K+1, H, A]``; step means ``[B, K, H, A]``; spreads ``[K]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from wmrl_vla.chain_config import CHAIN_SCORINGS

LOG_2PI = math.log(2 * math.pi)


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
    """Elementwise ``log N(x; mean, std^2) = -((x - mean) / std)^2 / 2 - log std - log(2 pi) / 2``
    (shapes broadcast)."""
    std = torch.as_tensor(std, dtype=x.dtype, device=x.device)
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * LOG_2PI


def chain_log_terms(chain: torch.Tensor, means: torch.Tensor, stds: torch.Tensor) -> torch.Tensor:
    """``[B, K+1, H, A]`` the chain's Gaussian log-density terms, one per chain state and chunk
    element: row 0 the standard-normal start ``log N(x^0; 0, 1)``, row ``k+1`` step ``k``'s
    ``log N(x^{k+1}; means[:, k], stds[k]^2)``.

    ``chain [B, K+1, H, A]`` (noise first), ``means [B, K, H, A]`` (``means[:, k]`` is the mean of
    step ``k`` given ``chain[:, k]``), ``stds [K]`` (> 0). Their sum is the chain's joint log-density."""
    b, k1 = chain.shape[:2]
    if means.shape != (b, k1 - 1, *chain.shape[2:]) or stds.shape != (k1 - 1,):
        raise ValueError(
            f"chain {tuple(chain.shape)}, means {tuple(means.shape)} and stds {tuple(stds.shape)} do not "
            "match: expected [B, K+1, H, A], [B, K, H, A], [K]"
        )
    start = gaussian_log_density(chain[:, :1], torch.zeros_like(chain[:, :1]), 1.0)
    steps = gaussian_log_density(chain[:, 1:], means, stds.to(chain.dtype).view(1, -1, 1, 1))
    return torch.cat([start, steps], 1)


def chain_log_prob(chain: torch.Tensor, means: torch.Tensor, stds: torch.Tensor) -> torch.Tensor:
    """``[B, H, A]`` log-density of each chunk element's chain, summed over its ``K`` steps and the
    standard-normal start (:func:`chain_log_terms` summed over its rows)::

        log N(x^0; 0, 1) + sum_{k<K} log N(x^{k+1}; means[:, k], stds[k]^2)

    Summing the result over ``H`` and ``A`` gives the chain's joint log-density."""
    return chain_log_terms(chain, means, stds).sum(1)


def check_ft_steps(ft_steps: int | None, steps: int) -> int:
    """The number ``K'`` of fine-tuned denoising steps: ``ft_steps`` (``None``: all ``steps`` = ``K``),
    refused in one line unless ``1 <= K' <= K``."""
    if ft_steps is None:
        return steps
    if not 1 <= ft_steps <= steps:
        raise ValueError(f"ft_denoising_steps={ft_steps} must be 1..{steps} (the chain's denoising steps)")
    return int(ft_steps)


def scored_terms(
    steps: int, horizon: int, executed: int, scoring: str, ft_steps: int | None = None
) -> torch.Tensor:
    """``[K+1, H]`` bool: the rows (start, then step ``k`` as row ``k+1``) and chunk positions of
    :func:`chain_log_terms` that ``scoring`` sums, when the environment executes the chunk's first
    ``executed`` positions (``1 <= executed <= H``; closed loop: 1)::

        "joint"              every term: log p(x^0..x^K)                               exact
        "executed_marginal"  all but the final step's terms of positions >= executed:
                             log p(x^0..x^{K-1}, x^K[:executed])                       exact
        "executed_only"      positions < executed at every row (DPPO's heuristic)      biased

    ``"executed_marginal"`` is an exact marginal: given ``x^{K-1}`` the final step factorises over
    positions and nothing depends on an unexecuted ``x^K[j]``, so its Gaussian integrates to 1.
    ``"executed_only"`` is no density of what the policy samples: the U-Net mixes the chunk's
    positions, so the executed positions' step means depend on the intermediate states of the
    unexecuted ones, whose terms it drops (fewer terms: a ratio less sensitive to the parameters).

    ``ft_steps`` ``K'`` (DPPO's ``ft_denoising_steps``; ``None``: ``K``, every row as above): only the
    last ``K'`` steps are fine-tuned, the first ``K - K'`` run by a frozen base policy, so only rows
    ``K - K' + 1 .. K`` are kept (rows ``0 .. K - K'``, the start and the base's steps, dropped)::

        log p_theta(x^{K-K'+1..K} | x^{K-K'}, o) = sum_{k = K-K'}^{K-1} log N(x^{k+1}; m_theta(x^k, k, o), s_k^2 I)

    Exact for the ratio: the dropped terms do not depend on the fine-tuned parameters, so they are
    the same under the old and the new policy and cancel in ``log p_new - log p_old``."""
    if scoring not in CHAIN_SCORINGS:
        raise ValueError(f"chain scoring {scoring!r} is not one of {', '.join(CHAIN_SCORINGS)}")
    if not 1 <= executed <= horizon:
        raise ValueError(f"executed={executed} chunk positions: must be 1..{horizon} (the chunk length)")
    ft = check_ft_steps(ft_steps, steps)
    keep = torch.ones(steps + 1, horizon, dtype=torch.bool)
    if scoring == "executed_marginal":
        keep[-1, executed:] = False
    elif scoring == "executed_only":
        keep[:, executed:] = False
    if ft < steps:
        keep[: steps - ft + 1] = False
    return keep


def scored_chain_log_prob(
    chain: torch.Tensor,
    means: torch.Tensor,
    stds: torch.Tensor,
    scoring: str = "joint",
    executed: int = 1,
    ft_steps: int | None = None,
) -> torch.Tensor:
    """``[B, A]`` each action dimension's chain log-prob under ``scoring``: the terms of
    :func:`chain_log_terms` ``[B, K+1, H, A]`` kept by :func:`scored_terms` ``[K+1, H]``, summed over
    rows and chunk positions. ``"joint"`` is :func:`chain_log_prob` summed over ``H``.

    ``chain [B, K+1, H, A]``, ``stds [K]``; ``means [B, K', H, A]`` the means of the last ``K'`` =
    ``ft_steps`` steps only (``None``: ``K'`` = ``K``, all of them), the only ones scored: with
    ``K' < K`` the tail ``chain[:, K-K':]`` is scored as a chain whose start row is dropped."""
    steps = chain.shape[1] - 1
    ft = check_ft_steps(ft_steps, steps)
    first = steps - ft  # 0 when the whole chain is fine-tuned: today's terms exactly
    terms = chain_log_terms(chain[:, first:], means, stds[first:])  # [B, K'+1, H, A]
    keep = scored_terms(steps, terms.shape[2], executed, scoring, ft)[first:].to(terms.device)
    return (terms * keep[None, :, :, None]).sum((1, 2))


def sample_chain(
    step_mean: Callable[[torch.Tensor, int], torch.Tensor],
    start: torch.Tensor,
    stds: torch.Tensor,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the chain from ``start [B, H, A]`` (the noise ``x^0``): ``x^{k+1} = step_mean(x^k, k) +
    temperature * stds[k] * eps_k``, ``eps_k ~ N(0, I)`` from ``generator``. Returns ``(chain
    [B, K+1, H, A], means [B, K, H, A])``; ``temperature`` 0 gives the chain of means."""
    xs, ms = [start], []
    for k in range(stds.shape[0]):
        m = step_mean(xs[-1], k)
        eps = torch.randn(m.shape, generator=generator, dtype=m.dtype).to(m.device)
        ms.append(m)
        xs.append(m + temperature * float(stds[k]) * eps)
    return torch.stack(xs, 1), torch.stack(ms, 1)


def ddpm_step_mean(
    x_t: torch.Tensor,
    model_output: torch.Tensor,
    alpha_bar_t: float | torch.Tensor,
    alpha_bar_prev: float | torch.Tensor,
    prediction_type: str = "epsilon",
    clip_sample_range: float | None = 1.0,
) -> torch.Tensor:
    """The DDPM posterior mean ``E[x_{t'} | x_t, x0_hat]`` (Ho et al. 2020, eq. 7; diffusers'
    ``DDPMScheduler.step`` before its noise), ``t' < t`` the previous inference timestep::

        x0_hat = (x_t - sqrt(1 - ab_t) eps_hat) / sqrt(ab_t)    (prediction_type "epsilon")
               = model_output                                  ("sample")
        x0_hat <- clip(x0_hat, -r, r)                          (clip_sample_range r; None: no clip)
        a_t = ab_t / ab_prev,  b_t = 1 - a_t
        mean = sqrt(ab_prev) b_t / (1 - ab_t) x0_hat + sqrt(a_t) (1 - ab_prev) / (1 - ab_t) x_t

    ``ab`` are cumulative alpha products (``ab_prev`` = 1 past the last step): floats, or tensors that
    broadcast against ``x_t`` and ``model_output`` ``[..., H, A]`` (one pair per row)."""
    ab_t = torch.as_tensor(alpha_bar_t, dtype=x_t.dtype, device=x_t.device)
    ab_prev = torch.as_tensor(alpha_bar_prev, dtype=x_t.dtype, device=x_t.device)
    if prediction_type == "epsilon":
        x0 = (x_t - (1 - ab_t).sqrt() * model_output) / ab_t.sqrt()
    elif prediction_type == "sample":
        x0 = model_output
    else:
        raise ValueError(f"prediction_type={prediction_type!r} is not one of epsilon, sample")
    if clip_sample_range is not None:
        x0 = x0.clamp(-clip_sample_range, clip_sample_range)
    a_t = ab_t / ab_prev
    return (ab_prev.sqrt() * (1 - a_t) * x0 + a_t.sqrt() * (1 - ab_prev) * x_t) / (1 - ab_t)


def ddpm_step_std(alpha_bar_t: float, alpha_bar_prev: float, min_std: float) -> float:
    """``max(sqrt((1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev)), min_std)``: DDPM's ``fixed_small``
    posterior standard deviation (0 on the last step), floored at ``min_std`` > 0."""
    var = (1 - alpha_bar_prev) / (1 - alpha_bar_t) * (1 - alpha_bar_t / alpha_bar_prev)
    return max(math.sqrt(max(var, 0.0)), min_std)


def ddpm_chain_schedule(scheduler, num_steps: int) -> list[tuple[int, float, float]]:
    """``[(t, ab_t, ab_prev)]`` of a diffusers ``DDPMScheduler``/``DDIMScheduler``'s ``num_steps``
    inference timesteps (``set_timesteps(num_steps)``, its own spacing), ``ab_prev`` 1 past the last."""
    from diffusers import DDPMScheduler

    ddpm = DDPMScheduler.from_config(scheduler.config)  # the same betas, DDPM's own step rule
    ddpm.set_timesteps(num_steps)
    ab = ddpm.alphas_cumprod.double()
    out = []
    for t in ddpm.timesteps.tolist():
        prev = int(ddpm.previous_timestep(t))
        out.append((int(t), float(ab[t]), float(ab[prev]) if prev >= 0 else 1.0))
    return out


def euler_step_mean(x_t: torch.Tensor, velocity: torch.Tensor, dt: float) -> torch.Tensor:
    """The flow-matching Euler step's mean ``x_t + v_theta(x_t, t) dt`` (``[..., H, A]``); the
    stochastic step adds ``sigma sqrt(|dt|) eps`` (:func:`euler_step_std`)."""
    return x_t + velocity * dt


def euler_step_std(sigma: float, dt: float) -> float:
    """``sigma sqrt(|dt|)``: the Euler-Maruyama step's standard deviation for noise level ``sigma`` > 0."""
    if sigma <= 0:
        raise ValueError(f"sigma={sigma} must be > 0 (the step needs a density)")
    return sigma * math.sqrt(abs(dt))
