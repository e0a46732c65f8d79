"""The TypeScript reader (conformance/examples/node/), written from SPEC.md alone, passes the suite.

It is built with the project's own lock file (``npm ci``, only when node_modules is missing or
older than package-lock.json, then ``npm run build``) and run through the adapter protocol
against the whole default suite: every golden vector and the default generated checkpoints.
Node.js and npm are part of the project's toolchain (``make toolchains``): without them the
test fails rather than skips.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from command import assert_passes_the_default_suite

REPO = Path(__file__).resolve().parents[2]
NODE_READER = REPO / "conformance" / "examples" / "node"


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make toolchains` to install Node.js and npm "
                    "(needed by conformance/examples/node)", pytrace=False)
    return found


def run(*args: str) -> None:
    result = subprocess.run(args, cwd=NODE_READER, capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{shlex.join(args)} failed:\n{result.stdout}\n{result.stderr}"


def needs_install() -> bool:
    installed = NODE_READER / "node_modules" / ".package-lock.json"  # written by npm ci
    lock = NODE_READER / "package-lock.json"
    return not installed.exists() or lock.stat().st_mtime > installed.stat().st_mtime


def build() -> Path:
    tool("node")
    npm = tool("npm")
    if needs_install():
        run(npm, "ci", "--no-audit", "--no-fund")
    run(npm, "run", "build")
    main = NODE_READER / "dist" / "main.js"
    assert main.is_file(), "npm run build did not produce dist/main.js"
    return main


def test_node_reader_passes_the_whole_default_suite(tmp_path: Path) -> None:
    main = build()
    command = f"{shlex.quote(tool('node'))} {shlex.quote(str(main))}"
    assert_passes_the_default_suite(command, tmp_path / "kept")
