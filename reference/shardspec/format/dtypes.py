"""The dtypes of SPEC 6.4: their bit widths, byte-size arithmetic and torch equivalents.

SPEC.md's dtype table is the source; ``tests/docs/test_spec_agreement.py`` checks this table
against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from .limits import MAX_SIZE

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "DType",
    "bit_count",
    "byte_size",
    "element_count",
    "from_torch",
    "spec_shape",
    "torch_layout",
]


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    #: The torch dtype holding it, or None where torch has none (F6): such tensors load as
    #: packed uint8 bytes.
    torch_name: str | None
    #: How many elements one torch element packs (2 for F4 as float4_e2m1fn_x2).
    per_torch_element: int = 1

    @property
    def torch_dtype(self) -> torch.dtype | None:
        import torch  # only where tensors are made: validating a checkpoint needs no torch

        return getattr(torch, self.torch_name, None) if self.torch_name else None


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("BOOL", 8, "bool"),
        DType("U8", 8, "uint8"),
        DType("I8", 8, "int8"),
        DType("I16", 16, "int16"),
        DType("U16", 16, "uint16"),
        DType("I32", 32, "int32"),
        DType("U32", 32, "uint32"),
        DType("I64", 64, "int64"),
        DType("U64", 64, "uint64"),
        DType("F16", 16, "float16"),
        DType("BF16", 16, "bfloat16"),
        DType("F32", 32, "float32"),
        DType("F64", 64, "float64"),
        DType("C64", 64, "complex64"),
        DType("F8_E4M3", 8, "float8_e4m3fn"),
        DType("F8_E5M2", 8, "float8_e5m2"),
        DType("F8_E8M0", 8, "float8_e8m0fnu"),
        DType("F8_E4M3FNUZ", 8, "float8_e4m3fnuz"),
        DType("F8_E5M2FNUZ", 8, "float8_e5m2fnuz"),
        DType("F4", 4, "float4_e2m1fn_x2", per_torch_element=2),
        DType("F6_E2M3", 6, None),
        DType("F6_E3M2", 6, None),
    )
}


@cache
def _by_torch() -> dict[torch.dtype, DType]:
    return {d.torch_dtype: d for d in DTYPES.values() if d.torch_dtype is not None}



def from_torch(dtype: torch.dtype) -> DType:
    """The spec dtype of a torch dtype; ValueError for one the format cannot hold."""
    try:
        return _by_torch()[dtype]
    except KeyError:
        raise ValueError(f"torch dtype {dtype} has no shardspec dtype (SPEC 6.4)") from None


def element_count(shape: tuple[int, ...] | list[int]) -> int | None:
    """The product of ``shape``, or None where it would reach 2**63 (SPEC 7.1)."""
    count = 1
    for dim in shape:
        count *= dim
        if count > MAX_SIZE:
            return None
    return count


def bit_count(dtype: DType, shape: tuple[int, ...] | list[int]) -> int | None:
    """Bits a tensor of ``shape`` takes, or None where its element count or its bit count
    would reach 2**63 (SPEC 7.1 rule 4: either is shape-overflow for a tensor's shape)."""
    count = element_count(shape)
    if count is None or count * dtype.bits > MAX_SIZE:
        return None
    return count * dtype.bits


def byte_size(dtype: DType, shape: tuple[int, ...] | list[int]) -> int | None:
    """Bytes a tensor of ``shape`` takes, or None where that overflows or is not whole bytes.

    Sub-byte dtypes pack densely (SPEC 6.5): element count x bits must be a multiple of 8.
    """
    count = element_count(shape)
    if count is None:
        return None
    bits = count * dtype.bits
    if bits > MAX_SIZE or bits % 8:
        return None
    return bits // 8


def torch_layout(dtype: DType, shape: tuple[int, ...]) -> tuple[torch.dtype, tuple[int, ...]]:
    """The torch dtype and shape that hold a tensor of spec ``dtype`` and ``shape``.

    F4 becomes float4_e2m1fn_x2 with the last dimension halved (two elements a byte); F6, which
    torch lacks, becomes its packed bytes as uint8 with the last dimension scaled by 6/8. Where
    the last dimension does not divide evenly the result is flat.
    """
    torch_dtype = dtype.torch_dtype
    if torch_dtype is not None and dtype.per_torch_element == 1:
        return torch_dtype, shape
    if torch_dtype is None:
        import torch

        torch_dtype = torch.uint8
    nbytes = byte_size(dtype, shape)
    assert nbytes is not None, "shape was checked before"
    width = shape[-1] * dtype.bits if shape else 0
    if shape and width % 8 == 0 and (width // 8) % torch_dtype.itemsize == 0:
        return torch_dtype, (*shape[:-1], width // 8 // torch_dtype.itemsize)
    return torch_dtype, (nbytes // torch_dtype.itemsize,)


def spec_shape(tensor: torch.Tensor) -> tuple[DType, tuple[int, ...]]:
    """The spec dtype and element shape of a torch tensor (F4 counts 4-bit elements)."""
    dtype = from_torch(tensor.dtype)
    shape = tuple(tensor.shape)
    if dtype.per_torch_element != 1 and shape:
        shape = (*shape[:-1], shape[-1] * dtype.per_torch_element)
    elif dtype.per_torch_element != 1:
        raise ValueError(f"a {tensor.dtype} scalar packs {dtype.per_torch_element} elements; "
                         "give it shape [1]")
    return dtype, shape
