"""Resharding by boxes: any rectangular slice of any global tensor, for one reader.

:class:`~shardspec.reshard.plan.Resharder` derives what each rank holds from a target
:class:`~shardspec.format.manifest.Layout`. A reader with its own rules (a serving engine
whose workers slice by heads or pad the vocabulary) names the boxes it wants instead; the plan
says which source pieces each box is read from, and :func:`shardspec.reshard.load.execute_reshard`
reads only the bytes that overlap it (SPEC 11.3).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..format.errors import Finding, error_for
from ..format.manifest import Layout, Manifest, Piece, TensorRecord
from .geometry import intersect, volume
from .plan import Resharder
from .targets import Box, ReshardPlan, SourcePiece, TargetPiece

__all__ = ["plan_boxes"]


def plan_boxes(manifest: Manifest, boxes: Mapping[str, Box]) -> ReshardPlan:
    """The plan that reads ``boxes`` (tensor name -> box in global coordinates).

    Each box must lie inside its tensor (an alias is read by its target's name). Of replicated
    pieces, one already read from is preferred, then the lowest rank, so that as few files as
    possible are opened.
    """
    pieces: dict[str, TargetPiece] = {}
    used: set[int] = set()
    for name, box in boxes.items():
        record = manifest.tensors.get(name)
        if not isinstance(record, TensorRecord) or record.shape is None:
            raise error_for(Finding(code="reshard-rank-local", tensor=name, message=(
                "only a global tensor can be read by box (SPEC 7.5)")))
        offset, shape = box
        if len(offset) != len(record.shape) or any(
                o < 0 or s < 0 or o + s > g for o, s, g in zip(offset, shape, record.shape,
                                                              strict=True)):
            raise error_for(Finding(code="reshard-unsupported", tensor=name, message=(
                f"box at {list(offset)} of shape {list(shape)} is not inside the tensor's "
                f"shape {list(record.shape)}")))
        sources: list[SourcePiece] = []
        if volume(shape):
            for slot, holders in Resharder._slots_of(record).items():
                overlap = intersect(slot, box)
                if overlap is None or not volume(overlap[1]):
                    continue
                piece = _pick(holders, used)
                sources.append(_source(piece, record, overlap))
            if sum(volume(s.box_shape) for s in sources) != volume(shape):
                raise error_for(Finding(code="coverage-gap", tensor=name, message=(
                    "the source pieces do not cover the box asked for")))
        pieces[name] = TargetPiece(dtype=record.dtype, global_shape=record.shape, offset=offset,
                                   shape=shape, replica=0, sources=tuple(sources))
    return ReshardPlan(0, Layout(tp_size=1), pieces, {})


def _pick(holders: list[Piece], used: set[int]) -> Piece:
    reused = [p for p in holders if p.rank in used]
    piece = min(reused or holders, key=lambda p: p.rank)
    used.add(piece.rank)
    return piece


def _source(piece: Piece, record: TensorRecord, overlap: Box) -> SourcePiece:
    assert record.shape is not None
    return SourcePiece(rank=piece.rank, file=piece.file,
                       piece_offset=piece.offset or (0,) * len(record.shape),
                       piece_shape=piece.shape, box_offset=overlap[0], box_shape=overlap[1])
