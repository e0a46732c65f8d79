"""Which device a rank's tensors go to (SPEC 11.2, informative for other implementations)."""

from __future__ import annotations

import os

import torch

from ..format.errors import Finding, RequestError

__all__ = ["DeviceLike", "resolve_device"]

DeviceLike = torch.device | str | int | None


def _invalid(device: object, why: str) -> RequestError:
    return RequestError(Finding(code="device-invalid", message=f"device {device!r}: {why}"))


def resolve_device(device: DeviceLike) -> torch.device:
    """None -> ``cuda:<LOCAL_RANK>`` where CUDA is available, else ``cpu``; int -> a CUDA index."""
    if device is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local_rank = os.environ.get("LOCAL_RANK", "0")
        if not local_rank.isdigit():
            raise _invalid(device, f"LOCAL_RANK={local_rank!r} is not a non-negative integer")
        device = int(local_rank)
    if isinstance(device, bool):
        raise _invalid(device, "a bool is not a device")
    if isinstance(device, int):
        if device < 0:
            raise _invalid(device, "a CUDA index cannot be negative")
        device = torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as exc:
            raise _invalid(device, str(exc)) from None
    elif not isinstance(device, torch.device):
        raise _invalid(device, "expected a torch.device, a string, an int or None")
    if device.type not in ("cpu", "cuda"):
        # the loader reads into host memory and stages to CUDA; any other device would get
        # host tensors back without a word
        raise _invalid(device, "the reference reader loads onto 'cpu' or 'cuda' devices only")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise _invalid(device, "CUDA is not available on this machine")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise _invalid(device, f"only {torch.cuda.device_count()} CUDA devices are visible")
        device = torch.device("cuda", index)
    return device
