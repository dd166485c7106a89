"""``ConfigError`` and the small checks every config dataclass's ``__post_init__`` makes.

Shared by the run config (wmrl/config.py) and the methods' configs (wmrl/method_config.py), so
neither imports the other for them; the messages quote the offending values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from wmrl.config_messages import did_you_mean


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the offending value."""


def check(cond: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``cond``."""
    if not cond:
        raise ConfigError(message)


def finite(section: Any, prefix: str) -> None:
    """Refuse a float field of ``section`` that is inf or nan (``--grpo.lr=inf`` parses as a float,
    then failed deep inside torch without naming the field)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name}={value} must be a finite number")


def one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuse a ``value`` of field ``name`` that is not one of ``choices``, naming the closest."""
    check(
        value in choices, f"{name}={value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}"
    )
