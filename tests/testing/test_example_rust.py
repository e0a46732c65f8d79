"""The Rust reader (conformance/examples/rust/), written from SPEC.md alone, passes the suite.

It is built offline with cargo (standard library only, no crates) into its own ignored
``target/`` directory, and run through the adapter protocol against the whole default suite:
every golden vector and the default generated checkpoints. Its unit tests (the SHA-256 test
vectors of FIPS 180-4, the strict JSON dialect, the safetensors header rules) run with
``cargo test``. cargo is part of the project's toolchain (``make toolchains``): without it the
tests fail rather than skip.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from command import assert_passes_the_default_suite

REPO = Path(__file__).resolve().parents[2]
RUST_READER = REPO / "conformance" / "examples" / "rust"
TARGET = RUST_READER / "target"  # ignored by conformance/examples/rust/.gitignore


def cargo() -> str:
    found = shutil.which("cargo")
    if found is None:
        pytest.fail("cargo is not installed: run `make toolchains` to install the Rust toolchain "
                    "(needed by conformance/examples/rust)", pytrace=False)
    return found


def run_cargo(*args: str) -> None:
    command = [cargo(), *args, "--release", "--offline", "--manifest-path",
               str(RUST_READER / "Cargo.toml")]
    env = {**os.environ, "CARGO_TARGET_DIR": str(TARGET)}
    result = subprocess.run(command, cwd=RUST_READER, env=env, capture_output=True, text=True,
                            timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (f"{shlex.join(command)} failed:\n{result.stdout}\n"
                                    f"{result.stderr}")


def build() -> Path:
    run_cargo("build")
    binary = TARGET / "release" / "shardspec-reader"
    assert binary.is_file(), "cargo build did not produce target/release/shardspec-reader"
    return binary


def test_rust_reader_unit_tests_pass() -> None:
    run_cargo("test")


def test_rust_reader_passes_the_whole_default_suite(tmp_path: Path) -> None:
    binary = build()
    assert_passes_the_default_suite(shlex.quote(str(binary)), tmp_path / "kept")
