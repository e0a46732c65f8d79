"""The conformance suite runs from the installed wheel, outside any checkout (issue 24).

The wheel is built from this checkout (``python -m build --wheel``) and installed into a fresh
virtual environment in a temporary directory outside the repository. That environment sees the
main environment's packages (torch, Hypothesis, ...) through a ``.pth`` line appended after its
own site-packages, so nothing is downloaded; the test checks that the ``shardspec`` it imports
is the wheel's, with the vectors the wheel ships. Then the installed ``shardspec`` command runs
the suite, from an empty directory, against the example readers: the minimal reader, the
reference adapter (batch form), and the Rust and Node readers, built as their own tests build
them. Every run must pass, find its vectors in the installed package, and leave the current
directory empty.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "conformance" / "vectors"
EXAMPLES = REPO / "conformance" / "examples"


def _run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 600
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(the fresh environment's bin/ directory, the environment to run it with)."""
    base = tmp_path_factory.mktemp("wheel")
    assert REPO not in base.parents, "the environment must lie outside the repository"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dist = base / "dist"
    build = [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)]
    if importlib.util.find_spec("hatchling") is not None:
        build.insert(3, "--no-isolation")  # else build fetches hatchling from the index
    made = _run(build, cwd=base, env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    (wheel,) = dist.glob("shardspec-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = {f"shardspec/_conformance/vectors/{p.relative_to(VECTORS).as_posix()}"
               for p in VECTORS.rglob("*") if p.is_file()}
    assert shipped <= names, sorted(shipped - names)[:5]
    assert "shardspec/_conformance/materialize.py" in names

    root = base / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                cwd=base, env=env).stdout.strip()
    # the main environment's packages, after the new one's own (a plain path: the main
    # environment's .pth files, such as an editable shardspec, are not processed)
    (Path(site) / "main-env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                str(wheel)], cwd=base, env=env)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    where = _run([str(python), "-c", "import shardspec, shardspec.testing as t; "
                  "print(shardspec.__file__); print(t.find_vectors())"], cwd=base, env=env)
    assert where.returncode == 0, where.stderr
    module, vectors = where.stdout.split()
    assert Path(module) == Path(site) / "shardspec" / "__init__.py", module
    assert Path(vectors) == Path(site) / "shardspec" / "_conformance" / "vectors", vectors
    return root / "bin", env


def _suite(installed: tuple[Path, dict[str, str]], reader: str, tmp_path: Path,
           *options: str) -> None:
    """Run the installed suite (``--quick``) from an empty directory; it must pass there."""
    bin_dir, env = installed
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = _run([str(bin_dir / "shardspec"), "conformance", "--quick", "--implements",
                   "blake2b", "--reader", reader, *options], cwd=cwd, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "PASS" in result.stdout
    site_vectors = Path("_conformance") / "vectors"
    assert f"vectors: {bin_dir.parent}" in result.stdout.replace("\n", "")
    assert str(site_vectors) in result.stdout.replace("\n", "")
    checks = int(result.stdout.split("PASS: ")[1].split(" vector checks")[0])
    first_ranks = sum(bool(json.loads(p.read_text())["ranks"])
                      for p in VECTORS.glob("*/vector.json"))
    assert checks >= first_ranks  # every vector ran (--quick: its first rank, plus no others)
    assert list(cwd.iterdir()) == [], "the suite wrote into the current directory"


def test_installed_suite_runs_the_minimal_reader(installed: tuple[Path, dict[str, str]],
                                                tmp_path: Path) -> None:
    reader = f"{shlex.quote(str(installed[0] / 'python'))} " \
             f"{shlex.quote(str(EXAMPLES / 'minimal_reader.py'))}"
    _suite(installed, reader, tmp_path)


def test_installed_suite_runs_the_reference_adapter(installed: tuple[Path, dict[str, str]],
                                                   tmp_path: Path) -> None:
    # the adapter imports the installed shardspec (the fixture checked which one that is)
    reader = f"{shlex.quote(str(installed[0] / 'python'))} " \
             f"{shlex.quote(str(EXAMPLES / 'reference_reader.py'))} --batch"
    _suite(installed, reader, tmp_path, "--batch")


def test_installed_suite_runs_the_rust_reader(installed: tuple[Path, dict[str, str]],
                                             tmp_path: Path) -> None:
    from test_example_rust import build

    _suite(installed, shlex.quote(str(build())), tmp_path)


def test_installed_suite_runs_the_node_reader(installed: tuple[Path, dict[str, str]],
                                             tmp_path: Path) -> None:
    from test_example_node import build, tool

    _suite(installed, f"{shlex.quote(tool('node'))} {shlex.quote(str(build()))}", tmp_path)


def test_without_keep_a_failure_is_kept_in_a_temporary_directory(
        installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """A reader that fails (``false`` refuses every checkpoint) keeps its failing checkpoint
    under the temporary directory, named in the report, and nothing in the current
    directory."""
    bin_dir, env = installed
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    temp = tmp_path / "temp"
    temp.mkdir()
    result = _run([str(bin_dir / "shardspec"), "conformance", "--no-vectors", "--quick",
                   "--examples", "1", "--reader", "false"], cwd=cwd,
                  env={**env, "TMPDIR": str(temp)})
    assert result.returncode == 1, result.stdout + result.stderr
    assert list(cwd.iterdir()) == []
    (kept_in,) = temp.glob("shardspec-conformance-*")
    (kept,) = kept_in.iterdir()
    assert kept.name == "generated-seed-0"
    assert (kept / "failure.json").is_file()
    assert str(kept) in result.stdout.replace("\n", "")
