"""Where models train and run: ``--device=auto|cpu|cuda|cuda:N`` (``RunConfig.device``).

A domain builds its models on :func:`resolve_device` of the run's device and keeps its own tensors
there; the trainer moves each batch to the policy's device for the update (:meth:`RolloutBatch.to`).
Rollout records, rewards and metrics stay on the CPU.
"""

from __future__ import annotations

import contextlib
import os

import torch

from wmrl.config import DEVICE_RE, PRECISIONS

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
    for b in module.buffers():
        return b.device
    return torch.device("cpu")


def check_precision(precision: str, device: torch.device, unsupported: str | None = None) -> None:
    """Raise :class:`DeviceError` for a precision this device (or model) cannot autocast to.

    ``unsupported``: a domain's reason its models do not run under bf16 autocast (None: they do)."""
    if precision not in PRECISIONS:
        raise DeviceError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    if unsupported:
        raise DeviceError(f"precision={precision} is not supported here: {unsupported}; use --precision=fp32")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError(
            f"precision=bf16 but {torch.cuda.get_device_name(device)} has no bfloat16 support; use --precision=fp32"
        )


def autocast(precision: str, device: torch.device):
    """A context: ``torch.autocast`` to bfloat16 on ``device`` for ``precision="bf16"`` (matmuls and
    convolutions in bf16, reductions and softmax in float32), nothing for ``fp32``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
