"""Whether boxes of one tensor share an element (SPEC 7.3 rule 5), in n log n.

A manifest is untrusted: a tensor may be cut into 65,536 pieces along two dimensions at once
(a staircase: column i cut at row i), and comparing each piece with every piece it might meet
took minutes. The sweep here moves along one dimension; the boxes it is inside of (the
*active* ones) hold no element in common so far, so along the dimensions left their
cross-sections are disjoint. Where the boxes differ in at most two dimensions, those cross
sections are disjoint intervals, kept sorted: a new box can only meet the one that starts last
before it ends, one lookup. Boxes that differ in three or more dimensions are compared with
the active ones whose intervals along a second dimension reach theirs.
"""

from __future__ import annotations

import heapq

from sortedcontainers import SortedList

__all__ = ["Box", "first_overlap"]

#: (offset, shape) of a piece, both with the tensor's number of dimensions.
Box = tuple[tuple[int, ...], tuple[int, ...]]


def first_overlap(boxes: list[Box]) -> tuple[int, int] | None:
    """Indices of two boxes that share an element, or None.

    Every box must hold an element (no zero dimension) and have the same number of dimensions.
    """
    if len(boxes) < 2:
        return None
    ndim = len(boxes[0][0])
    # A dimension where every box spans the same interval cannot separate two of them.
    varying = [d for d in range(ndim) if len({(b[0][d], b[1][d]) for b in boxes}) > 1]
    if not varying:  # every box is the same (scalars included)
        return (0, 1)
    # Sweep along the dimension with the most distinct starts: the fewest boxes active at once.
    sweep = max(varying, key=lambda d: len({b[0][d] for b in boxes}))
    others = [d for d in varying if d != sweep]
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0][sweep])
    if not others:
        return _along_one(boxes, order, sweep)
    return _sweep(boxes, order, sweep, others)


def _along_one(boxes: list[Box], order: list[int], d: int) -> tuple[int, int] | None:
    """Boxes that differ in dimension ``d`` alone: intervals sorted by start."""
    reach, widest = -1, -1  # the furthest end so far, and its box
    for i in order:
        start = boxes[i][0][d]
        if start < reach:
            return (widest, i)
        end = start + boxes[i][1][d]
        if end > reach:
            reach, widest = end, i
    return None


def _sweep(boxes: list[Box], order: list[int], sweep: int,
           others: list[int]) -> tuple[int, int] | None:
    """The sweep of the module docstring; ``others`` are the varying dimensions but ``sweep``."""
    key = others[0]
    exact = len(others) == 1  # cross-sections are disjoint intervals along ``key``
    active: SortedList[tuple[int, int]] = SortedList()  # (start along key, box), pairwise apart
    ending: list[tuple[int, int]] = []  # heap of (end along sweep, box)
    for i in order:
        offset, shape = boxes[i]
        here = offset[sweep]
        while ending and ending[0][0] <= here:
            j = heapq.heappop(ending)[1]
            active.remove((boxes[j][0][key], j))
        start, end = offset[key], offset[key] + shape[key]
        # Active boxes starting before this one ends, the last first.
        below = active.bisect_left((end, -1))
        if exact:
            if below:
                j = active[below - 1][1]
                if boxes[j][0][key] + boxes[j][1][key] > start:
                    return (j, i)
        else:
            for k in range(below - 1, -1, -1):
                j = active[k][1]
                if all(max(offset[d], boxes[j][0][d])
                       < min(offset[d] + shape[d], boxes[j][0][d] + boxes[j][1][d])
                       for d in others):
                    return (j, i)
        active.add((start, i))
        heapq.heappush(ending, (here + shape[sweep], i))
    return None
