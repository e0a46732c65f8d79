"""SPEC 6.4-6.5: dtype bit widths, byte sizes and the torch types that hold them."""

from __future__ import annotations

import pytest
import torch

from shardspec.format.dtypes import (
    DTYPES,
    byte_size,
    element_count,
    from_torch,
    spec_shape,
    torch_layout,
)
from shardspec.format.limits import MAX_SIZE


def test_every_torch_dtype_maps_back() -> None:
    for dtype in DTYPES.values():
        if dtype.torch_dtype is not None:
            assert from_torch(dtype.torch_dtype) is dtype


def test_f6_has_no_torch_dtype() -> None:
    assert DTYPES["F6_E2M3"].torch_dtype is None and DTYPES["F6_E3M2"].bits == 6


@pytest.mark.parametrize("dtype", [torch.complex128, torch.int4 if hasattr(torch, "int4")
                                   else torch.quint8])
def test_unsupported_torch_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="SPEC 6.4"):
        from_torch(dtype)


@pytest.mark.parametrize(
    ("name", "shape", "expected"),
    [("F32", [2, 3], 24), ("BF16", [], 2), ("U8", [0, 5], 0), ("C64", [3], 24),
     ("F4", [2, 4], 4), ("F4", [3], None), ("F6_E2M3", [4], 3), ("F6_E3M2", [2], None),
     ("U8", [2**62, 2], None), ("I64", [2**60], None),
     # SPEC 6.5: the bit count, not only the byte count, stays at most MAX_SIZE
     ("U8", [2**60 - 1], 2**60 - 1), ("U8", [2**60], None), ("F4", [2**61 - 2], 2**60 - 1),
     ("F4", [2**61], None)],
)
def test_byte_size(name: str, shape: list[int], expected: int | None) -> None:
    assert byte_size(DTYPES[name], shape) == expected


def test_element_count_stops_at_2_to_63() -> None:
    assert element_count([]) == 1
    assert element_count([2**31, 2**31]) == 2**62
    assert element_count([2**32, 2**31]) is None
    assert element_count([0, 2**40, 2**40]) == 0
    assert element_count([MAX_SIZE]) == MAX_SIZE


@pytest.mark.parametrize(
    ("name", "shape", "torch_dtype", "torch_shape"),
    [("F32", (2, 3), torch.float32, (2, 3)), ("F4", (3, 8), torch.float4_e2m1fn_x2, (3, 4)),
     ("F4", (2, 3), torch.float4_e2m1fn_x2, (3,)), ("F6_E2M3", (2, 4), torch.uint8, (2, 3)),
     ("F6_E2M3", (2, 2), torch.uint8, (3,)), ("F4", (0, 4), torch.float4_e2m1fn_x2, (0, 2))],
)
def test_torch_layout(name: str, shape: tuple[int, ...], torch_dtype: torch.dtype,
                      torch_shape: tuple[int, ...]) -> None:
    assert torch_layout(DTYPES[name], shape) == (torch_dtype, torch_shape)


def test_spec_shape_counts_f4_elements() -> None:
    packed = torch.zeros(3, 5, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert spec_shape(packed) == (DTYPES["F4"], (3, 10))
    with pytest.raises(ValueError, match="scalar"):
        spec_shape(torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    assert spec_shape(torch.zeros((), dtype=torch.float16)) == (DTYPES["F16"], ())
