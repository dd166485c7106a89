"""How a denoising-chain policy (``--domain.policy=lerobot_diffusion``) is executed and scored: the
``domain.chain`` group of the VLA config. Light to import (no torch): the config checks it before
anything is built, and :class:`wmrl_vla.diffusion_bridge.DiffusionBridgeConfig` takes its defaults."""

from __future__ import annotations

from dataclasses import dataclass

from wmrl.config import ConfigError

# The chain terms a decision's log-probability sums (wmrl_vla.denoising_chain.scored_terms).
CHAIN_SCORINGS = ("joint", "executed_marginal", "executed_only")


@dataclass
class DenoisingChainConfig:
    # Chunk positions executed open loop per sampled chain, one GRPO decision each (DPPO's
    # act_steps): 1 is closed loop (the chunk's first action, a new chain every step); at most the
    # policy's chunk horizon. Imagined rollouts execute the chunk the same way.
    act_steps: int = 1
    # The chain terms a decision's log-prob sums: "joint" (all: exact), "executed_marginal" (the
    # unexecuted positions' final step integrated out: exact) or "executed_only" (DPPO's heuristic,
    # the executed positions alone at every step: biased). See wmrl_vla/denoising_chain.py.
    scoring: str = "joint"
    # Fine-tune only the chain's last K' denoising steps, the first K - K' run by a frozen copy of the
    # policy as GRPO starts (DPPO's ft_denoising_steps); null: the whole chain.
    ft_denoising_steps: int | None = None

    def check(self, policy: str, chain_policy: str) -> None:
        """Refuse bad values, or a non-default chain for a ``policy`` other than ``chain_policy``, in one
        line naming the ``domain.chain`` field."""
        if self.scoring not in CHAIN_SCORINGS:
            raise ConfigError(
                f"domain.chain.scoring={self.scoring!r} is not one of {', '.join(CHAIN_SCORINGS)}"
            )
        if self.act_steps < 1:
            raise ConfigError(f"domain.chain.act_steps={self.act_steps} must be >= 1")
        if self.ft_denoising_steps is not None and self.ft_denoising_steps < 1:
            raise ConfigError(
                f"domain.chain.ft_denoising_steps={self.ft_denoising_steps} must be >= 1 (or null)"
            )
        if self != DenoisingChainConfig() and policy != chain_policy:
            raise ConfigError(
                f"domain.chain applies to domain.policy={chain_policy} (a denoising chain executed in "
                f"chunks), not {policy}; drop the domain.chain.* settings"
            )

    def bridge_fields(self) -> dict:
        """The fields of :class:`~wmrl_vla.diffusion_bridge.DiffusionBridgeConfig` (and of
        ``DiffusionChainPolicy``'s constructors) these settings give."""
        return {"act_steps": self.act_steps, "chain_scoring": self.scoring,
                "ft_denoising_steps": self.ft_denoising_steps}  # fmt: skip
