"""What the suite tells as it goes: :class:`Progress` (the command line shows it)."""

from __future__ import annotations

from collections.abc import Callable

from .checks import CheckResult

__all__ = ["Progress", "as_progress"]


class Progress:
    """Told what the suite does as it goes; the default does nothing. The command line shows
    it (a status line on a terminal, a line every few seconds otherwise, each failure as it
    comes)."""

    def part(self, name: str, total: int) -> None:
        """A part starts: ``name`` ("vectors", "generated") with ``total`` items."""

    def item(self, label: str) -> None:
        """The next item of the part: a vector's id, a generated checkpoint's number."""

    def checked(self, result: CheckResult) -> None:
        """One check is done (a failure may be shrunk and reported again at the end)."""


def as_progress(progress: Progress | Callable[[str], None] | None) -> Progress:
    """A :class:`Progress`; a plain function is told each item's label (the older form)."""
    if progress is None:
        return Progress()
    if not callable(progress):  # anything with part, item and checked
        return progress
    function = progress

    class _Labels(Progress):
        def item(self, label: str) -> None:
            function(label)

    return _Labels()
