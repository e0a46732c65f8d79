"""Tied tensors (SPEC 8.4): the block of a scale that goes with a piece of its weight."""

from __future__ import annotations

from shardspec.format.manifest import Logical, Piece, TensorRecord, Tie
from shardspec.format.ties import packing, tie_problem, tied_box


def record(dtype: str, shape: tuple[int, ...], logical: tuple[int, ...] | None = None,
           tie: Tie | None = None) -> TensorRecord:
    return TensorRecord(dtype=dtype, shape=shape, pieces=(Piece(
        rank=0, file="f", shape=shape, offset=(0,) * len(shape)),),
        logical=None if logical is None else Logical(dtype="BF16", shape=logical),
        tied_to=tie)


def test_block_scales_follow_rows_and_columns_with_a_short_last_block() -> None:
    weight = record("F8_E4M3", (256, 320))
    tie = Tie(tensor="w", block=(128, 128))
    assert tied_box(weight, ((128, 0), (128, 320)), tie, (2, 3)) == ((1, 0), (1, 3))
    assert tied_box(weight, ((0, 256), (256, 64)), tie, (2, 3)) == ((0, 2), (2, 1))
    assert "inside a block of 128" in str(tied_box(weight, ((64, 0), (192, 320)), tie, (2, 3)))


def test_packed_bases_count_grid_elements() -> None:
    qweight = record("I32", (64, 8), logical=(64, 64))      # AWQ: 8 int4 a stored element
    assert packing(qweight) == (1, 8)
    qzeros = Tie(tensor="q", block=(16, 8))
    assert tied_box(qweight, ((0, 4), (64, 4)), qzeros, (4, 8)) == ((0, 4), (4, 4))
    gptq = record("I32", (8, 12), logical=(64, 12))         # GPTQ: packed along the input
    zeros = Tie(tensor="q", block=(16, 8))
    assert "inside a block of 8" in str(tied_box(gptq, ((0, 0), (8, 4)), zeros, (4, 2)))


def test_broadcast_dims_inner_dims_and_whole_values() -> None:
    weight = record("F8_E4M3", (32, 64))
    channel = Tie(tensor="w", block=(1,), axes=(0,))         # [o, 1]: dim 1 is inner
    assert tied_box(weight, ((0, 32), (32, 32)), channel, (32, 1)) == ((0, 0), (32, 1))
    assert tied_box(weight, ((16, 0), (16, 64)), channel, (32, 1)) == ((16, 0), (16, 1))
    assert tied_box(weight, ((16, 0), (16, 64)), Tie(tensor="w"), ()) == ((), ())
    blocks = record("U8", (4, 8, 2, 16), logical=(4, 8, 64))  # MXFP4: inner dim of 16 bytes
    assert "inner dim 3" in str(tied_box(blocks, ((0, 0, 0, 0), (4, 8, 2, 8)),
                                         Tie(tensor="b", block=(1, 1, 32)), (4, 8, 2)))


def test_tie_problems_have_their_codes() -> None:
    weight = record("F8_E4M3", (256, 256))
    tensors: dict[str, object] = {"w": weight}

    def code(tie: Tie, shape: tuple[int, ...]) -> str | None:
        finding = tie_problem("s", record("F32", shape, tie=tie), tensors)
        return None if finding is None else finding.code

    assert code(Tie(tensor="w", block=(128, 128)), (2, 2)) is None
    assert code(Tie(tensor="missing", block=(128, 128)), (2, 2)) == "tie-target"
    assert code(Tie(tensor="s", block=(128, 128)), (2, 2)) == "tie-target"
    assert code(Tie(tensor="w", block=(128, 128)), (2, 1)) == "tie-shape"
    assert code(Tie(tensor="w", block=(1, 1), axes=(0, 0)), (256, 256)) == "tie-shape"
    assert code(Tie(tensor="w"), (2,)) == "tie-shape"
    tensors["w"] = record("I32", (64, 5), logical=(64, 64))
    assert code(Tie(tensor="w", block=(16, 8)), (4, 8)) == "tie-shape"


def test_a_base_piece_outside_its_tensor_is_left_to_the_bounds_rules() -> None:
    """A malformed base piece is piece-bounds (7.2), not a crash of the tie check."""
    from shardspec import Layout
    from shardspec.format.checks import check_manifest
    from shardspec.format.manifest import FileRecord, Manifest, Quantization, RankRecord

    layout = Layout(tp_size=2)
    ranks = tuple(RankRecord(rank=r, **layout.coordinates(r), files=(FileRecord(
        path=f"r{r}", size=1, checksums={"sha256": "0" * 64}),)) for r in range(2))
    weight = TensorRecord(dtype="F8_E4M3", shape=(256, 256), pieces=(
        Piece(rank=0, file="r0", shape=(256, 128), offset=(0, 0)),
        Piece(rank=1, file="r1", shape=(256, 128), offset=(0,))))
    scale = TensorRecord(dtype="F32", shape=(2, 2), tied_to=Tie(tensor="w", block=(128, 128)),
                         pieces=(Piece(rank=0, file="r0", shape=(2, 1), offset=(0, 0)),
                                 Piece(rank=1, file="r1", shape=(2, 1), offset=(0, 1))))
    manifest = Manifest(format_version="1.2", layout=layout, ranks=ranks,
                        quantization=Quantization(), tensors={"w": weight, "s": scale})
    assert [f.code for f in check_manifest(manifest)] == ["piece-bounds", "coverage-gap"]
