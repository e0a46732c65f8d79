"""Whether the model vLLM built and the checkpoint agree on every global shape.

vLLM's weight loaders narrow a handed tensor to ``tp_rank * n`` .. ``(tp_rank + 1) * n`` where
``n`` is the parameter's own length: they never compare the checkpoint's length along the cut
with the model's. Where a checkpoint was written for a larger model than config.json describes
(its split dimension longer than ``tp_size * n``), vLLM would take rows of the wrong share
without an error, and rows the plugin never read (:mod:`.regions`: only the worker's box of a
handed tensor holds data).

So before any byte is read, the recording of ``load_weights`` (:mod:`.recorder`) is held
against the boxes vLLM's rules give the worker of each checkpoint tensor's global shape: every
region a parameter takes must lie inside the tensor's box, and where the box is the worker's
share (a cut tensor, or any tensor at ``tp_size`` 1) the regions taken must reach its ends.
Tensors read in part by design (routed experts under expert parallelism; fused ones vLLM cuts
per member) are held to the first rule only. What the loader computes on rather than copies (a
scale converted to its parameter's dtype) is held to both, by every element it may have read
(:attr:`.recorder.Recording.taken`): a byte vLLM uses that the worker would not read refuses
the load, naming the tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from ...format.errors import Finding, error_for
from ...reshard.plan import Box
from .placements import covering_box, source_box
from .recorder import Recording

__all__ = ["bounding", "check_agreement"]


def check_agreement(recording: Recording, shapes: Mapping[str, tuple[int, ...]],
                    boxes: Mapping[str, Box], exact: Collection[str],
                    targets: Mapping[str, torch.Tensor]) -> None:
    """Refuse (``reshard-unsupported``, naming the tensor and the parameter) where a recorded
    copy takes a region outside its tensor's box in ``boxes``, or where the regions taken of a
    tensor in ``exact`` do not span its box. ``shapes``: each tensor's global shape."""
    spans: dict[str, tuple[Box, str]] = {}  # tensor -> bounding box taken, a target taking it
    taken = [(copy.source, source_box(copy.src, shapes[copy.source]), copy.target)
             for copy in recording.copies]
    # what the loader computed on (converted, broadcast): every element it may have read
    taken += [(name, covering_box(region, shapes[name]), "?")
              for name, regions in recording.taken.items() for region in regions]
    for name, region, target in taken:
        box = boxes.get(name)
        if box is None or region is None:
            continue  # not handed by box, or no box: the placement refuses it by itself
        if not _inside(region, box):
            raise _disagreement(name, shapes[name], target, targets, region, box)
        before = spans.get(name)
        spans[name] = (region if before is None else bounding(before[0], region),
                       target if before is None or before[1] == "?" else before[1])
    for name, (span, target) in spans.items():
        if name in exact and span != boxes[name]:
            raise _disagreement(name, shapes[name], target, targets, span, boxes[name])


def _disagreement(name: str, shape: tuple[int, ...], target: str,
                  targets: Mapping[str, torch.Tensor], taken: Box, box: Box) -> Exception:
    held = list(targets[target].shape) if target in targets else "?"
    return error_for(Finding(
        code="reshard-unsupported", tensor=name, file="shardspec.json",
        message=f"the checkpoint holds it as {list(shape)}, but vLLM's parameter {target!r} "
        f"(this worker's part: {held}) takes {_ranges(taken)} of it where this worker's "
        f"share is {_ranges(box)}: the checkpoint's model is not the one config.json "
        f"describes"))


def _ranges(box: Box) -> str:
    return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(*box, strict=True)) + "]"


def _inside(inner: Box, outer: Box) -> bool:
    return all(o <= i and i + n <= o + m
               for i, n, o, m in zip(inner[0], inner[1], outer[0], outer[1], strict=True))


def bounding(a: Box, b: Box) -> Box:
    start = tuple(min(x, y) for x, y in zip(a[0], b[0], strict=True))
    end = tuple(max(x + s, y + t) for x, s, y, t in zip(a[0], a[1], b[0], b[1], strict=True))
    return start, tuple(e - s for s, e in zip(start, end, strict=True))
