"""Judging one reader call: did it load exactly what it must, or refuse what it must refuse?

Each judgement names the SPEC requirement (a section number such as ``"7.6"``) that a failure
breaks: a missing alias breaks 7.6, a mislabelled dtype 6.4, another rank's tensors 11.1. The
pseudo-requirement ``"protocol"`` stands for the adapter protocol itself (an output that is
missing or not a safetensors file).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from .adapter import Outcome, RankTensors

__all__ = ["PROTOCOL", "CheckResult", "diagnose", "judge_load", "judge_refusal"]

#: The pseudo-requirement of the adapter protocol.
PROTOCOL = "protocol"

_SUB_BYTE = {"F4", "F6_E2M3", "F6_E3M2"}


@dataclass(frozen=True)
class CheckResult:
    """One check of the suite: one reader call and its judgement."""

    #: A stable name, e.g. ``vectors/valid-tied-weights/rank-1``.
    check: str
    #: The SPEC sections the check exercises (a passed check) or the one it broke (a failure).
    requirements: tuple[str, ...]
    passed: bool
    message: str = ""
    #: The reader's stderr (and stdout), tail only.
    reader_output: str = ""
    #: Where the failing checkpoint can be found (a vector, or a kept generated checkpoint).
    checkpoint: str | None = None
    part: str = "vectors"
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def requirement(self) -> str:
        return self.requirements[0] if self.requirements else PROTOCOL


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _name_section(name: str, data: RankTensors, aliases: Collection[str]) -> str:
    if name in aliases:
        return "7.6"
    dtype, shape, _ = data[name]
    if shape == () or _count(shape) == 0:
        return "7.7"
    return "7.2"


def diagnose(
    expected: RankTensors,
    actual: RankTensors,
    *,
    rank: int,
    others: Mapping[int, RankTensors] | None = None,
    aliases: Collection[str] = (),
) -> tuple[str, str] | None:
    """The requirement a loaded rank breaks and why, or None when it is exactly as expected."""
    if actual == expected:
        return None
    for other, tensors in sorted((others or {}).items()):
        if other != rank and actual and tensors == actual and tensors != expected:
            return "11.1", f"returned rank {other}'s tensors instead of rank {rank}'s"
    problems: list[tuple[str, str]] = []
    for name in sorted(set(expected) - set(actual)):
        problems.append((_name_section(name, expected, aliases),
                         f"tensor {name!r} is missing"))
    for name in sorted(set(actual) - set(expected)):
        problems.append(("7.6" if name in aliases else "7.2",
                         f"returned {name!r}, which rank {rank} does not hold"))
    for name in sorted(set(expected) & set(actual)):
        (dtype, shape, data), (got_dtype, got_shape, got) = expected[name], actual[name]
        if got_dtype != dtype:
            problems.append(("6.4", f"tensor {name!r} has dtype {got_dtype}, expected {dtype}"))
        elif got_shape != shape:
            section = ("6.5" if dtype in _SUB_BYTE else
                       "7.7" if shape == () or _count(shape) == 0 else "7.2")
            problems.append((section, f"tensor {name!r} has shape {list(got_shape)}, expected "
                             f"{list(shape)}"))
        elif got != data:
            where = next((i for i, (a, b) in enumerate(zip(got, data, strict=False)) if a != b),
                         min(len(got), len(data)))
            problems.append(("6.5" if dtype in _SUB_BYTE else "7.2",
                             f"tensor {name!r} ({dtype} {list(shape)}) differs from byte "
                             f"{where} on{_byte_detail(dtype, shape, where, data, got)}"))
    section, message = problems[0]
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} other differences)"
    return section, message


def _byte_detail(dtype: str, shape: tuple[int, ...], where: int, expected: bytes,
                 got: bytes) -> str:
    """Which element holds the first differing byte, and both bytes there."""
    if where >= len(expected) or where >= len(got):
        return f" (expected {len(expected)} bytes, got {len(got)})"
    from ..format.dtypes import DTYPES

    bits = DTYPES[dtype].bits
    element = where * 8 // bits
    index: list[int] = []
    for size in reversed(shape):  # row-major: the last dim varies fastest
        index.append(element % size if size else 0)
        element //= size or 1
    return (f" (element {list(reversed(index))}: expected byte 0x{expected[where]:02x}, got "
            f"0x{got[where]:02x})")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no message"


def judge_load(
    outcome: Outcome,
    expected: RankTensors,
    *,
    rank: int,
    sections: tuple[str, ...],
    others: Mapping[int, RankTensors] | None = None,
    aliases: Collection[str] = (),
) -> tuple[tuple[str, ...], bool, str]:
    """A valid checkpoint: the reader must exit 0 and write exactly ``expected``.

    Returns (requirements, passed, message): ``sections`` on success, the broken one otherwise.
    """
    first = sections[0] if sections else "11.1"
    if outcome.timed_out:
        return (first,), False, f"timed out after {outcome.seconds:.0f} s"
    if not outcome.accepted:
        return (first,), False, (f"refused a valid checkpoint (exit {outcome.exit_code}): "
                                 f"{_last_line(outcome.stderr)}")
    if not outcome.wrote_output:
        return (PROTOCOL,), False, "exited 0 but wrote no output file"
    if outcome.output is None:
        return (PROTOCOL,), False, f"the output is not a valid safetensors file: " \
                                   f"{outcome.output_error}"
    found = diagnose(expected, outcome.output, rank=rank, others=others, aliases=aliases)
    if found is None:
        return sections, True, ""
    return (found[0],), False, found[1]


def judge_refusal(
    outcome: Outcome, *, section: str, code: str
) -> tuple[tuple[str, ...], bool, str]:
    """An invalid checkpoint: the reader must exit non-zero and write nothing (SPEC 1.1)."""
    if outcome.timed_out:
        return (section,), False, (f"timed out after {outcome.seconds:.0f} s instead of "
                                   f"refusing with error {code}")
    if outcome.accepted:
        return (section,), False, f"accepted an invalid checkpoint (expected error {code})"
    if outcome.wrote_output:
        return ("1.1",), False, (f"refused (exit {outcome.exit_code}) but left an output "
                                 "file: an error returns no tensor data")
    return (section,), True, ""
