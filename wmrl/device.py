"""Where models train and run: ``--device=auto|cpu|cuda|cuda:N`` (``RunConfig.device``).

A domain builds its models on :func:`resolve_device` of the run's device and keeps its own tensors
there; the trainer moves each batch to the policy's device for the update (:meth:`RolloutBatch.to`).
Rollout records, rewards and metrics stay on the CPU.
"""

from __future__ import annotations

import os

import torch

from wmrl.config import DEVICE_RE

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def valid_device_spec(spec: str) -> bool:
    """Whether ``spec`` is one of ``auto``, ``cpu``, ``cuda``, ``cuda:N`` (syntax only)."""
    return isinstance(spec, str) and bool(DEVICE_RE.match(spec))


class DeviceError(RuntimeError):
    """A device that is not one of the choices, or not present on this machine."""


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> ``cuda`` when CUDA is present, else ``cpu``; ``cuda``/``cuda:N`` must exist here."""
    if not valid_device_spec(spec):
        raise DeviceError(f"device={spec!r} is not one of {DEVICE_CHOICES}")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device={spec!r} but CUDA is not available here (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'}, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}); use --device=cpu or auto"
        )
    dev = torch.device(spec)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"device={spec!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer); CPU for a module with neither."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")
