"""The ``shardspec`` command run in this process, as the CLI tests run it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from shardspec.cli import app

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr; rich wraps text at 80 columns, so text output has its
    whitespace runs folded to single spaces (JSON output is printed unwrapped)."""
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if "--json" in args:
        return result.exit_code, result.stdout, result.stderr
    return result.exit_code, fold(result.stdout), fold(result.stderr)


def fold(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def assert_passes_the_default_suite(reader: str, keep: Path) -> None:
    """``shardspec conformance --reader READER`` passes the whole default suite (with the
    optional blake2b checksums) and, having passed, keeps nothing under ``keep``."""
    result = runner.invoke(app, ["conformance", "--reader", reader, "--keep", str(keep),
                                 "--implements", "blake2b"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output
    assert not keep.exists()
