"""Name patterns of tensor-parallel plans and stage overrides, matched in time that does not
grow with the number of patterns a name could be checked against.

A pattern is a dotted name in which ``*`` stands for any run of characters other than ``.``.
Two costs are kept down, both met with hostile plans (issue 41 item 7, and its benchmark):

- one match: a segment's stars cut it into literal chunks, found in order with ``str.find``
  (the leftmost place of each chunk is always a right one), so a match takes one pass, never
  the exponential backtracking of a regular expression;
- many patterns: they are kept in a trie by segment, literal segments in a dict and starred
  ones in a list per node, and which starred segments match a segment of a name is computed
  once per node and text. A model's names share most segments (``layers``, the layer
  numbers, ``mlp``), so a plan of thousands of patterns costs thousands of checks per distinct
  segment, not per name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["PatternIndex", "glob"]

_STARS = re.compile(r"\*{2,}")


def glob(pattern: str, name: str) -> bool:
    """Whether ``name`` matches ``pattern`` whole (see the module docstring)."""
    parts, segments = pattern.split("."), name.split(".")
    return len(parts) == len(segments) and all(
        _segment(p.split("*"), s) for p, s in zip(parts, segments, strict=True))


def _segment(chunks: list[str], text: str) -> bool:
    """Whether ``text`` matches a segment pattern given as its chunks between stars."""
    if len(chunks) == 1:
        return chunks[0] == text
    first, last = chunks[0], chunks[-1]
    if len(first) + len(last) > len(text) or not text.startswith(first) or \
            not text.endswith(last):
        return False
    at, end = len(first), len(text) - len(last)
    for chunk in chunks[1:-1]:
        found = text.find(chunk, at, end)
        if found < 0:
            return False
        at = found + len(chunk)
    return True


@dataclass
class _Node:
    literal: dict[str, _Node] = field(default_factory=dict)
    starred: dict[str, tuple[list[str], _Node]] = field(default_factory=dict)  # by segment
    ends: list[int] = field(default_factory=list)  # indexes of the patterns ending here
    _matched: dict[str, list[_Node]] = field(default_factory=dict)

    def children(self, text: str) -> list[_Node]:
        """The children that segment ``text`` leads to."""
        found = self._matched.get(text)
        if found is None:
            found = [node for chunks, node in self.starred.values() if _segment(chunks, text)]
            self._matched[text] = found
        exact = self.literal.get(text)
        return found if exact is None else [exact, *found]


class PatternIndex:
    """Patterns (in order) -> which of them match a name whole, and which match its module
    (the name less its last segment)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = list(patterns)
        self._root = _Node()
        for index, pattern in enumerate(self.patterns):
            node = self._root
            for part in pattern.split("."):
                if "*" in part:
                    part = _STARS.sub("*", part)  # "**" means "*": one node, not many
                    if part not in node.starred:
                        node.starred[part] = (part.split("*"), _Node())
                    child = node.starred[part][1]
                else:
                    child = node.literal.setdefault(part, _Node())
                node = child
            node.ends.append(index)

    def matches(self, name: str) -> tuple[list[int], list[int]]:
        """(indexes of the patterns matching ``name``, of those matching its module)."""
        segments = name.split(".")
        nodes = [self._root]
        module: list[int] = []
        for depth, text in enumerate(segments):
            if depth == len(segments) - 1:
                module = [i for node in nodes for i in node.ends]
            nodes = [child for node in nodes for child in node.children(text)]
            if not nodes:
                return [], module
        return [i for node in nodes for i in node.ends], module
