"""``--domain.policy=lerobot_smolvla_chain``: the ``lerobot_smolvla`` bridge (same config fields, same
SFT) whose action is the end of a stochastic flow-matching chain with an exact log-probability
(:class:`wmrl_vla.smolvla_bridge.SmolVLAFlowChainPolicy`): rollouts record the chain
(``batch.extras["chains"]``) and GRPO's ratio is its re-scored log-probability. CPU only.
``wmrl export`` does not write it yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wmrl_vla.policies.base import register_policy_kind
from wmrl_vla.policies.lerobot_bridges import LeRobotSmolVLA


@register_policy_kind
class LeRobotSmolVLAChain(LeRobotSmolVLA):
    name = "lerobot_smolvla_chain"
    records_chain = True
    export_refused = (
        "wmrl export does not write a post-trained SmolVLA flow chain yet; its weights are the "
        "checkpoint's state['policy'] (SmolVLAFlowChainPolicy.load_state_dict)"
    )

    @staticmethod
    def policy_class():
        from wmrl_vla.smolvla_bridge import SmolVLAFlowChainPolicy

        return SmolVLAFlowChainPolicy

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
        raise ValueError(self.export_refused)
