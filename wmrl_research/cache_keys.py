"""Keys of the research domain's on-disk caches (SFT policy, execution logs, WMs, evaluations)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wmrl_research.tasks.base import DATA_LAYOUT_VERSION


def cache_key(fields: Any) -> str:
    """12 hex digits of the SHA-256 of ``fields`` as sorted JSON: equal fields, equal key."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]


def data_key() -> list[Any]:
    """What executed rewards depend on besides the config: the task data's layout (layout 2: secret
    splits, scores normalised against each build's own baseline and reference), so that execution
    logs and evaluations cached on layout 1's splits are not reused."""
    return [] if DATA_LAYOUT_VERSION == 1 else [f"data-layout-{DATA_LAYOUT_VERSION}"]
