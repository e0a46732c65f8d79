"""Each reading of the SPEC that issues 24 and 50 settled has a vector that a reader reading it the
other way fails.

For each, the minimal reader (conformance/examples/minimal_reader.py) is copied with its source
changed in one place to read the rule the other way; the copy must fail that vector, where the
minimal reader itself passes it. Readings whose every alternative only refuses (a different
error code) have no vector: the suite compares no codes, and SPEC says so where it settles them.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from shardspec.testing import PythonReader
from shardspec.testing.runner import run_vectors

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "conformance" / "vectors"
MINIMAL = REPO / "conformance" / "examples" / "minimal_reader.py"

_LEXICAL = '''def _lexical(path, depth=0):
    """Links followed component by component, '..' in their targets removed as text."""
    if depth > 40:
        return path
    out = "/"
    for part in path.strip("/").split("/"):
        step = os.path.join(out, part)
        if os.path.islink(step):
            step = _lexical(os.path.normpath(os.path.join(out, os.readlink(step))), depth + 1)
        out = step
    return out


def open_inside('''

#: vector id -> (the other reading, source edits of the minimal reader that make it)
READINGS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "valid-symlink-dotdot-after-link": ("'..' in a link's target taken lexically (2.2 rule 5)", [
        ("def open_inside(", _LEXICAL),
        ('resolved = os.path.realpath(os.path.join(root, *relative.split("/")))',
         'resolved = _lexical(os.path.join(root, *relative.split("/")))')]),
    "valid-manifest-symlink-inside": ("a manifest that is a link refused (2.1 rule 1, 2.3)", [
        ("    fd, size = open_inside(root, MANIFEST_NAME)\n",
         "    if os.path.islink(os.path.join(root, MANIFEST_NAME)):\n"
         "        fail('file-not-regular', 'a link')\n"
         "    fd, size = open_inside(root, MANIFEST_NAME)\n")]),
    "valid-integer-negative-zero": ("-0 is not an integer token of 0 (3.3 rule 3)", [
        ("def _int(token: str) -> int:\n",
         "def _int(token: str) -> int:\n    if token == '-0':\n"
         "        raise JSONProblem('syntax', '-0')\n")]),
    "json-nonfinite-integer-rounds-to-infinity": ("integers are too large from 2^1024 on "
                                                  "(3.3 rule 2)", [
        ("if len(token) > 300 and math.isinf(float(token)):",
         "if len(token) > 300 and abs(int(token)) >= 2**1024:")]),
    "valid-generator-astral-characters": ("maxLength counts UTF-16 units (3.5 rule 2)", [
        ("self.need(len(value) <= max_length,",
         "self.need(len(value.encode('utf-16-le')) // 2 <= max_length,")]),
    "valid-newer-minor-alias-with-rank-local": ("rank_local decides before alias_of (4.3 rule "
                                                "2)", [
        ('        if "alias_of" in record:\n            self.members(',
         '        if "alias_of" in record and "rank_local" not in record:\n'
         '            self.members(')]),
    "st-header-json-lone-surrogate": ("a header may hold a lone surrogate (6.3 rule 2)", [
        ("    if any(_SURROGATE.search(s) for s in _strings(value)):",
         "    if not value and any(_SURROGATE.search(s) for s in _strings(value)):")]),
    "shape-overflow-bit-count": ("only element counts of shapes are bounded (7.1 rule 4)", [
        ("    return count is not None and count * DTYPE_BITS[dtype] <= MAX_SIZE",
         "    return count is not None")]),
    "shape-overflow-logical-bit-count": ("only element counts of shapes are bounded (7.1 rule "
                                         "4)", [
        ("    return count is not None and count * DTYPE_BITS[dtype] <= MAX_SIZE",
         "    return count is not None")]),
    "st-size-rank-local-element-overflow": ("element counts wrap around at 2^64 (7.1 rule 4, "
                                            "6.5 rule 2)", [
        ("        count *= dim\n        if count > MAX_SIZE:\n            return None\n",
         "        count = count * dim % 2**64\n")]),
    "valid-coverage-zero-size-piece": ("an empty piece overlaps the piece around its offset "
                                       "(7.3 rule 2)", [
        ("    return all(max(o1, o2) < min(o1 + s1, o2 + s2)\n",
         "    return all(o1 <= o2 < o1 + max(s1, 1) or o2 <= o1 < o2 + max(s2, 1)\n")]),
    "tie-shape-base-dimension-not-zero": ("4 divides 0, so a base dimension 4 over a grid "
                                          "dimension 0 packs (8.4 rule 2)", [
        ("        elif size == 0 or extent == 0 or extent % size:",
         "        elif size == 0 or extent % size:")]),
    "tie-split-inner-dimension-no-block": ("inner dimensions are whole only with a block (8.4 "
                                           "rule 4)", [
        ("            if any(offset[d] or size[d] != base[\"shape\"][d]\n",
         "            if block is not None and any(offset[d] or size[d] != base[\"shape\"][d]\n")]),
    "valid-tie-replicas-numbered-apart": ("a tied piece's replica number is its base piece's "
                                          "(8.4 rule 4)", [
        ("            held = mine[rank]\n",
         "            held = mine[rank]\n"
         "            if held.get('replica', 0) != piece.get('replica', 0):\n"
         "                fail('tie-split', 'replica numbers differ')\n")]),
    # issue 50: joins (SPEC 4.2 rule 4, 7.2 rules 3 and 7)
    "piece-duplicate-joins-in-format-1.2": ("any 1.x manifest may join pieces (4.2 rule 4)", [
        ("    if minor < 3:\n", "    if minor < 0:\n")]),
    "valid-several-pieces-newer-minor": ("only a 1.3 manifest may join pieces (7.2 rule 3)", [
        ("    if minor < 3:\n", "    if minor != 3:\n")]),
    "valid-several-pieces-linked-file": ("a link to a listed file is that file (7.2 rule 3)", [
        ("    held: dict[str, list[tuple[list[int], Tensor]]] = {}  # name -> (offset, piece's "
         "array)\n",
         "    held: dict[str, list[tuple[list[int], Tensor]]] = {}  # name -> (offset, piece's "
         "array)\n    seen = {}\n"),
        ("        fd, size = open_inside(root, path)  # (a)\n",
         "        fd, size = open_inside(root, path)  # (a)\n"
         "        same = seen.setdefault(os.fstat(fd)[1:3], path)\n"
         "        if same != path and set(wanted.get(path, {})) & set(wanted.get(same, {})):\n"
         "            fail('piece-duplicate', 'two pieces in one file')\n")]),
    "valid-several-pieces-listed-out-of-order": ("pieces join in the files' part order (7.2 "
                                                 "rule 7)", [
        ("    pieces = sorted(pieces, key=lambda p: p[0])  # offsets differ only along d\n",
         "    pieces = list(pieces)\n")]),
    "piece-duplicate-empty-inside-run": ("an empty piece may lie inside another's run, as it "
                                         "overlaps nothing (7.3 rule 2)", [
        ("    if any(o1 == o2 or o1 + s1 > o2 for", "    if any(o1 == o2 for")]),
    "piece-duplicate-empty-pieces-overlapping": ("runs need not follow one another (7.2 rule "
                                                 "7)", [
        ("    if any(o1 == o2 or o1 + s1 > o2 for", "    if any(o1 == o2 for")]),
    "valid-several-pieces-empty-at-end": ("an empty piece joins nothing (7.2 rule 7)", [
        ("    runs = sorted((p[\"offset\"][d], p[\"shape\"][d]) for p in pieces)\n",
         "    if any(0 in p['shape'] for p in pieces):\n        return None\n"
         "    runs = sorted((p[\"offset\"][d], p[\"shape\"][d]) for p in pieces)\n")]),
    "valid-several-pieces-empty-whole-byte-runs": ("empty pieces join nothing (7.2 rule 7)", [
        ("    runs = sorted((p[\"offset\"][d], p[\"shape\"][d]) for p in pieces)\n",
         "    if any(0 in p['shape'] for p in pieces):\n        return None\n"
         "    runs = sorted((p[\"offset\"][d], p[\"shape\"][d]) for p in pieces)\n")]),
    "piece-duplicate-sub-byte-empty-half-byte-runs": ("the whole-byte rule holds only for "
                                                      "pieces with elements (7.2 rule 7)", [
        ("    if any(math.prod(p[\"shape\"][d:]) * DTYPE_BITS[dtype] % 8 for p in pieces):",
         "    if any(math.prod(p['shape']) and math.prod(p[\"shape\"][d:]) * DTYPE_BITS[dtype]"
         " % 8 for p in pieces):")]),
}


def minimal_reader(tag: str, edits: list[tuple[str, str]]) -> types.ModuleType:
    """A private copy of the minimal reader with ``edits`` applied to its source."""
    text = MINIMAL.read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) == 1, f"the minimal reader changed: {old!r}"
        text = text.replace(old, new)
    name = f"minimal_reader_reading_{tag}"
    module = types.ModuleType(name)
    module.__file__ = str(MINIMAL)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(text, str(MINIMAL), "exec"), module.__dict__)  # noqa: S102 - our own file
    return module


def outcomes(module: types.ModuleType, vector: str) -> list[bool]:
    results, notes = run_vectors(PythonReader(module.read), VECTORS, select=vector)
    assert not notes and results, (vector, notes)
    return [r.passed for r in results]


@pytest.mark.parametrize("vector", sorted(READINGS))
def test_the_other_reading_fails_the_vector(vector: str) -> None:
    assert (VECTORS / vector / "vector.json").is_file()
    _, edits = READINGS[vector]
    assert all(outcomes(minimal_reader("as-is", []), vector)), "the minimal reader passes it"
    assert not all(outcomes(minimal_reader(vector.replace("-", "_"), edits), vector))
