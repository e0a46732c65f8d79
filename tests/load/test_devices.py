"""SPEC 11.2: which device a rank's tensors go to."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from shardspec import RequestError
from shardspec.load.devices import resolve_device


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def invalid(device: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        resolve_device(device)
    assert info.value.code == "device-invalid" and info.value.section == "11.2"
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.usefixtures("no_cuda")
def test_default_is_cpu_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device(None) == torch.device("cpu")


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_cpu_is_cpu(device: Any) -> None:
    assert resolve_device(device) == torch.device("cpu")


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("device", [0, "cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_cuda_is_refused(device: Any) -> None:
    assert "not available" in str(invalid(device))


@pytest.mark.parametrize("device", ["garbage", "cuda:x", "", True, False, 1.5, object()])
def test_garbage_is_refused(device: Any) -> None:
    invalid(device)


@pytest.mark.usefixtures("four_gpus")
def test_default_is_cuda_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert resolve_device(None) == torch.device("cuda", 2)
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve_device(None) == torch.device("cuda", 0)


@pytest.mark.usefixtures("four_gpus")
@pytest.mark.parametrize("local_rank", ["7", "4", "-1", "one", ""])
def test_bad_local_rank_is_refused(monkeypatch: pytest.MonkeyPatch, local_rank: str) -> None:
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    invalid(None)


@pytest.mark.usefixtures("four_gpus")
@pytest.mark.parametrize(
    ("device", "expected"),
    [(3, "cuda:3"), ("cuda", "cuda:0"), ("cuda:1", "cuda:1"), (torch.device("cuda", 2), "cuda:2"),
     ("cpu", "cpu")],
)
def test_cuda_devices_are_normalized(device: Any, expected: str) -> None:
    assert resolve_device(device) == torch.device(expected)


@pytest.mark.usefixtures("four_gpus")
@pytest.mark.parametrize("device", [4, "cuda:4", -1])
def test_cuda_index_out_of_range_is_refused(device: Any) -> None:
    invalid(device)


@pytest.mark.parametrize("device", ["meta", torch.device("meta"), "xpu"])
def test_devices_the_loader_cannot_fill_are_refused(device: Any) -> None:
    # the loader reads into host memory (and stages to CUDA): any other device type would
    # silently get host tensors back
    assert "'cpu' or 'cuda'" in str(invalid(device))
