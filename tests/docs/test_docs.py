"""The code in the docs works: every Python and shell block of the Quickstart and the guides runs.

Each page runs in a fresh temporary directory, its blocks in order, against the checkpoints its
own earlier blocks write. Python blocks (``python``) run in one namespace per page, like one
interactive session; shell blocks (``sh``, ``bash``, ``console``: the ``$`` lines) run with
``bash -euo pipefail`` and this interpreter's ``bin`` first on ``PATH``, so ``python`` and
``shardspec`` are the ones under test. Every block must succeed. Other languages (``text``,
``json``, ...) are not run. An HTML comment on the line before a block (blank lines between are
allowed) changes what happens to it:

- ``<!-- skip-test: REASON -->``: not run; the reason is required (keep these rare: a block
  that installs packages, or needs what CI does not have, such as vLLM and GPUs);
- ``<!-- write-file: NAME -->``: the block's text is written to NAME in the page's directory
  (a script that a later shell block runs, or a JSON file a command reads);
- ``<!-- output -->``: the block shows output: each of its non-empty lines must appear, with
  runs of whitespace folded, in the output of the block run just before it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [DOCS / "quickstart.md", *sorted((DOCS / "guides").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
SHELL = {"sh", "bash", "shell", "console"}
SHELL_TIMEOUT = 300

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>skip-test|write-file|output)\s*(?::\s*(?P<arg>.*?))?"
                     r"\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None = None  # skip-test, write-file or output
    arg: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def parse(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the marker before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    marker: re.Match[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _MARKER.match(line)
        if found:
            marker = found
            i += 1
            continue
        opening = _FENCE.match(line)
        if not opening:
            if line.strip():
                marker = None
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        info = opening["info"].strip().lstrip("{").lstrip(".")
        lang = re.split(r"[\s}]", info, maxsplit=1)[0].lower() if info else ""
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence)
                                      and not lines[i].strip().strip(fence[0])):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        block = Block(page, start, lang, textwrap.dedent("\n".join(body)) + "\n")
        if marker:
            block.marker, block.arg = marker["kind"], marker["arg"]
        blocks.append(block)
        marker = None
        i += 1
    return blocks


def fold(text: str) -> str:
    return " ".join(text.split())


def shell_script(block: Block) -> str:
    if block.lang != "console":
        return block.code
    return "\n".join(line[2:] for line in block.code.splitlines() if line.startswith("$ "))


def run_python(block: Block, namespace: dict[str, object]) -> str:
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102 - the docs' code
    sys.stdout.write(captured.getvalue())
    return captured.getvalue()


def run_shell(block: Block, cwd: Path) -> str:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("SHARDSPEC_DEBUG", None)
    env["COLUMNS"] = "100"  # rich's width when not on a terminal; the docs show 100 columns
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", shell_script(block)], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=SHELL_TIMEOUT,
                            stdin=subprocess.DEVNULL, check=False)
    output = result.stdout + result.stderr
    sys.stdout.write(f"--- {block.where}\n{output}")
    assert result.returncode == 0, (
        f"{block.where}: exit status {result.returncode}\n{block.code}\n--- output\n{output}")
    return output


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = parse(page)
    assert any(b.lang in PYTHON | SHELL and b.marker is None for b in blocks), \
        f"{page.name} has no example that runs"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    last: Block | None = None
    output = ""
    for block in blocks:
        if block.marker == "skip-test":
            continue
        if block.marker == "write-file":
            assert block.arg, f"{block.where}: write-file needs a file name"
            (tmp_path / block.arg).write_text(block.code, encoding="utf-8")
            continue
        if block.marker == "output":
            assert last is not None, f"{block.where}: output shown before any block ran"
            for line in block.code.splitlines():
                if line.strip():
                    assert fold(line) in fold(output), (
                        f"{block.where}: {line.strip()!r} is not in the output of "
                        f"{last.where}:\n{output}")
            continue
        if block.lang in PYTHON:
            output = run_python(block, namespace)
        elif block.lang in SHELL:
            output = run_shell(block, tmp_path)
        else:
            continue
        last = block


def test_markers_are_well_formed() -> None:
    """Every skip has a reason, every output follows a block that runs, and skips stay rare."""
    skips = []
    for page in PAGES:
        previous: Block | None = None
        for block in parse(page):
            if block.marker == "skip-test":
                assert block.arg, f"{block.where}: skip-test needs a reason"
                skips.append(block.where)
            if block.marker == "output":
                assert previous is not None and previous.lang in PYTHON | SHELL \
                    and previous.marker is None, f"{block.where}: output after no run block"
            if block.marker in ("skip-test", "write-file"):
                assert block.lang in PYTHON | SHELL | {"json"}, block.where
            previous = block
    runnable = sum(1 for p in PAGES for b in parse(p) if b.lang in PYTHON | SHELL)
    assert len(skips) * 4 <= runnable, f"too many skipped examples: {skips}"


def test_parse_finds_indented_blocks_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        Text.

        === "tab"

            <!-- skip-test: a reason -->
            ```sh
            make thing
            ```

        ```python title="x.py"
        print("hi")
        ```

        <!-- output -->
        ```text
        hi
        ```
        """), encoding="utf-8")
    blocks = parse(page)
    assert [(b.lang, b.marker, b.arg, b.code) for b in blocks] == [
        ("sh", "skip-test", "a reason", "make thing\n"),
        ("python", None, None, 'print("hi")\n'),
        ("text", "output", None, "hi\n"),
    ]
    assert blocks[1].line == 10


# --- the generated parts of the site (docs/hooks.py) -------------------------------------------


@pytest.fixture(scope="module")
def hooks() -> object:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make test installs it)")
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_has_every_command(hooks: Any) -> None:
    import typer

    from shardspec.cli import app

    text = hooks.cli_reference()
    for command in typer.main.get_command(app).commands:
        assert f"## `shardspec {command}` {{#{command}}}" in text
    assert "`--checksums`" in text and "`--reader <str>`" in text


def test_schema_reference_has_every_field(hooks: Any) -> None:
    schema = json.loads((REPO / "schema" / "manifest.schema.json").read_text(encoding="utf-8"))
    text = hooks.schema_reference()
    for name in schema["$defs"]:
        assert f"{{#def-{name}}}" in text
    for name in schema["properties"]:
        assert f"| `{name}` |" in text


def test_benchmark_chart_uses_the_readme_numbers(hooks: Any) -> None:
    heading, rows = hooks.benchmark_table()
    assert heading and rows
    chart = hooks.benchmark_chart()
    assert chart.startswith("<svg")
    for row in rows:
        assert f"TP={row['TP']}" in chart and f"{float(row['shardspec s']):.3f} s" in chart


def test_included_files_get_site_links(hooks: Any) -> None:
    link = hooks._site_link
    assert link("SPEC 7.2", "../SPEC.md#72-pieces", "benchmarks", "") == \
        "[SPEC 7.2](spec.md#72-pieces)"
    assert link("vectors/", "vectors/", "conformance", "") == "`conformance/vectors/`"
    assert link("the script", "bench_load.py", "benchmarks/load", "guides") == \
        "the script (`benchmarks/load/bench_load.py`)"
    assert link("x", "https://example.org/x", "benchmarks", "") == "[x](https://example.org/x)"
    assert link("gone", "no-such-file.md", "benchmarks", "") == "[gone](no-such-file.md)"
    source = hooks.source("conformance/examples/minimal_reader.py", "load_rank")
    assert source.startswith("```python") and "def load_rank(" in source
