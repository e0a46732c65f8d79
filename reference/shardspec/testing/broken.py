"""Broken checkpoints for readers to refuse: :func:`broken_checkpoints` derives from a written
checkpoint one broken in one way, with the error code (SPEC 13) and section a reader must refuse
it under and the ranks that must fail: an unknown major version, a must-understand extension,
JSON dialect, schema, layout, piece, coverage, replica and alias errors, and data files that are
missing, truncated, corrupted or disagree with the manifest.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from ..format.limits import MANIFEST_NAME
from . import broken_files, broken_manifest
from .handwritten import read_st
from .mutations import REGISTRY, Context, DataFile, Mutation
from .strategies import GeneratedCheckpoint

__all__ = ["broken_checkpoints", "mutation_kinds"]

#: Every builder, manifest-level ones first: the order kinds are drawn from and listed in.
MUTATIONS = [*REGISTRY[broken_manifest.__name__], *REGISTRY[broken_files.__name__]]


@st.composite
def broken_checkpoints(draw: st.DrawFn, written: GeneratedCheckpoint,
                       prefer: str | None = None) -> Mutation:
    """A way to break ``written`` (a valid checkpoint on disk), with the error code, SPEC
    section and ranks that must fail. Apply it to a copy: ``mutation.apply(copy_dir)``.

    ``prefer`` names a kind (:func:`mutation_kinds`) to use when it applies to ``written``;
    drawing it before the checkpoint spreads the kinds evenly over a run."""
    m = json.loads((written.path / MANIFEST_NAME).read_bytes())
    files = []
    for rank in m["ranks"]:
        for record in rank["files"]:
            header, data = read_st(written.path / record["path"])
            files.append(DataFile(record["path"], rank["rank"], header, len(data)))
    ctx = Context(m, written, tuple(files))
    applicable = [(kind, builder) for kind, when, builder in MUTATIONS if when(ctx)]
    preferred = [(kind, builder) for kind, builder in applicable if kind == prefer]
    kind, builder = preferred[0] if preferred else draw(st.sampled_from(applicable),
                                                        label="mutation")
    return builder(draw, ctx)


def mutation_kinds() -> list[str]:
    """Every kind of broken checkpoint :func:`broken_checkpoints` can draw."""
    return [kind for kind, _, _ in MUTATIONS]
