"""The conformance suite (shardspec.testing, ``shardspec conformance``) and its readers.

The minimal reader (conformance/examples/minimal_reader.py, standard library only) passes the
whole suite through the adapter protocol, as a subprocess; the reference reader passes it
in-process (through its script for a few vectors: importing torch costs a second a call).
Every deliberately broken reader in conformance/broken_readers/ is caught, and the report
names the requirement it breaks. The writer's output validates and its manifests survive
parse -> serialize -> parse byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardspec
from shardspec.cli import app
from shardspec.format.manifest import format_version
from shardspec.format.parse import parse_manifest
from shardspec.testing import (
    CommandReader,
    PythonReader,
    broken_checkpoints,
    checkpoint_specs,
    find_vectors,
    judge_load,
    judge_refusal,
    mutation_kinds,
    read_output,
    reference_read,
    run_suite,
    write_output,
)
from shardspec.testing.adapter import BatchReader, OutputError
from shardspec.testing.profiles import PROFILES, conformance_defaults, profile_name
from shardspec.testing.runner import run_generated, run_vectors

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO / "conformance"
VECTORS = CONFORMANCE / "vectors"
MINIMAL = CONFORMANCE / "examples" / "minimal_reader.py"
BROKEN = sorted(p.stem for p in (CONFORMANCE / "broken_readers").glob("[a-z]*.py"))
PYTHON = shlex.quote(sys.executable)

#: Generated checkpoints per run: enough to exercise every feature, bounded for CI.
EXAMPLES = 15 if profile_name() == "ci" else 100


@cache
def module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"conformance_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["conformance", *args], catch_exceptions=False)


def test_vectors_are_found_from_a_checkout() -> None:
    assert find_vectors() == VECTORS


# --- readers that conform ------------------------------------------------------------------


def test_minimal_reader_passes_the_whole_suite_as_a_command(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = invoke("--reader", f"{PYTHON} {shlex.quote(str(MINIMAL))}", "--examples",
                    str(EXAMPLES), "--seed", "0", "--junit", str(junit),
                    "--keep", str(tmp_path / "kept"), "--implements", "blake2b")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output
    suites = ET.parse(junit).getroot()
    assert suites.get("failures") == "0"
    vectors, generated = suites.findall("testsuite")
    assert int(vectors.get("tests", "0")) >= 200
    assert any("checksum-mismatch-blake2b-only" in (case.get("name") or "")
               for case in vectors.iter("testcase"))  # declared, so it ran
    assert int(generated.get("tests", "0")) >= EXAMPLES
    assert not (tmp_path / "kept").exists()


def test_minimal_reader_reports_each_vectors_code(tmp_path: Path) -> None:
    """The worked example is exact: it refuses every invalid vector with its own code."""
    reader = module(MINIMAL)
    sys.path.insert(0, str(CONFORMANCE))
    try:
        from materialize import materialize
    finally:
        sys.path.remove(str(CONFORMANCE))
    for path in sorted(VECTORS.glob("*/vector.json")):
        vector = json.loads(path.read_text(encoding="utf-8"))
        if vector["valid"]:
            continue
        root = materialize(path.parent, tmp_path / vector["id"])
        for rank in vector["ranks"]:
            with pytest.raises(reader.ReadError) as caught:
                reader.load_rank(root, rank, ignore_extensions=vector.get("ignore_extensions",
                                                                          []))
            assert caught.value.code == vector["expected_code"], (vector["id"], str(caught.value))


def _minimal_variant(tmp_path: Path, change: str) -> CommandReader:
    """The minimal reader as a command, with ``change`` (Python) applied to its module ``m``."""
    script = tmp_path / "variant.py"
    script.write_text(
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(MINIMAL)!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        f"{change}\n"
        "sys.exit(m.main(sys.argv[1:]))\n")
    return CommandReader(f"{PYTHON} {shlex.quote(str(script))}")


def test_a_reader_without_blake2b_passes_unless_it_declares_it(tmp_path: Path) -> None:
    """Issue 41 item 16: BLAKE2b is OPTIONAL to implement (SPEC 9.2 rule 3), yet the vector
    checksum-mismatch-blake2b-only failed every reader that skips it. It now runs only for
    readers that declare it (--implements blake2b); others skip it with a note."""
    reader = _minimal_variant(tmp_path, "m.DIGESTS = ('sha256',)")
    results, notes = run_vectors(reader, VECTORS, select="checksum-mismatch-*")
    assert results and all(r.passed for r in results), [r.message for r in results
                                                          if not r.passed]
    assert not any("blake2b-only" in r.check for r in results)
    assert any("checksum-mismatch-blake2b-only: skipped" in n and "--implements blake2b" in n
               for n in notes), notes
    declared, _ = run_vectors(reader, VECTORS, select="checksum-mismatch-blake2b-only",
                              implements=["blake2b"])
    assert declared and not any(r.passed for r in declared)  # it declared what it lacks
    full, _ = run_vectors(CommandReader(f"{PYTHON} {shlex.quote(str(MINIMAL))}"), VECTORS,
                          select="checksum-mismatch-blake2b-only", implements=["blake2b"])
    assert full and all(r.passed for r in full)


def test_an_unknown_optional_feature_is_a_usage_error() -> None:
    result = invoke("--reader", "true", "--implements", "blake3", "--examples", "0")
    assert result.exit_code == 2
    assert "blake3" in result.output and "blake2b" in result.output


@pytest.mark.parametrize("batch", [False, True], ids=["command", "batch"])
def test_ignore_extensions_are_read_with_spaces_trimmed(tmp_path: Path, batch: bool) -> None:
    """Issue 41 item 17: SHARDSPEC_IGNORE_EXTENSIONS is cut at commas, with spaces and tabs
    around each item removed and empty items skipped. The vector sets it as a person would
    write it by hand; a reader that keeps the spaces refuses the checkpoint."""
    select = "valid-extension-ignored-by-user-spaced"
    if batch:
        script = CONFORMANCE / "examples" / "reference_reader.py"
        trims: Any = BatchReader(f"{PYTHON} {shlex.quote(str(script))} --batch")
    else:
        trims = CommandReader(f"{PYTHON} {shlex.quote(str(MINIMAL))}")
    try:
        results, _ = run_vectors(trims, VECTORS, select=select)
    finally:
        if batch:
            trims.close()
    assert results and all(r.passed for r in results), [r.message for r in results]
    keeps = _minimal_variant(tmp_path, "m.ignored_extensions = lambda: [n for n in os.environ"
                             ".get('SHARDSPEC_IGNORE_EXTENSIONS', '').split(',') if n]")
    results, _ = run_vectors(keeps, VECTORS, select=select)
    assert results and not any(r.passed for r in results)
    assert "extension-unsupported" in results[0].message + results[0].reader_output


def test_minimal_reader_uses_neither_torch_nor_the_reference_package() -> None:
    source = MINIMAL.read_text(encoding="utf-8")
    imports = set(re.findall(r"^\s*(?:import|from)\s+(\w+)", source, re.MULTILINE))
    assert imports <= {"__future__", "hashlib", "json", "math", "os", "re", "stat", "struct",
                       "sys", "collections", "typing", "numpy"}, imports


def test_reference_reader_passes_the_whole_suite(tmp_path: Path) -> None:
    result = run_suite(PythonReader(reference_read, "reference"), vectors=VECTORS,
                       examples=EXAMPLES, seed=1, keep=tmp_path, implements=["blake2b"])
    assert result.ok, [f"{f.check}: {f.message}" for f in result.failures]
    assert result.examples == EXAMPLES
    assert len([r for r in result.results if r.part == "vectors"]) >= 200


def test_reference_reader_script_follows_the_protocol(tmp_path: Path) -> None:
    script = CONFORMANCE / "examples" / "reference_reader.py"
    reader = CommandReader(f"{PYTHON} {shlex.quote(str(script))}")
    results, notes = run_vectors(reader, VECTORS, select="valid-tp1-minimal,version-major-2.0")
    assert [r.check for r in results] == ["vectors/valid-tp1-minimal/rank-0",
                                          "vectors/version-major-2.0/rank-0"]
    assert all(r.passed for r in results), [r.message for r in results]
    assert not notes


def test_reference_reader_passes_the_whole_default_suite_in_the_batch_form(tmp_path: Path
                                                                          ) -> None:
    """The torch adapter, started once: the default run (every vector, 25 generated
    checkpoints) through the batch protocol, with progress on stderr."""
    script = CONFORMANCE / "examples" / "reference_reader.py"
    result = CliRunner().invoke(app, [
        "conformance", "--batch", "--reader", f"{PYTHON} {shlex.quote(str(script))} --batch",
        "--keep", str(tmp_path / "kept")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert re.search(r"PASS: \d{3} vector checks \(0 failed\); 25 generated", result.output)
    assert "vectors 0/" in result.output and "checks passed" in result.output  # progress


BATCH = """
import os, sys
for line in sys.stdin:
    checkpoint, rank, output, ignore = line.rstrip("\\n").split("\\t")
    behaviour = os.path.basename(checkpoint)
    print(f"rank {rank} ignoring {ignore!r}", file=sys.stderr, flush=True)
    if behaviour == "hang":
        import time; time.sleep(60)
    if behaviour == "exit":
        sys.exit(3)
    print("garbage" if behaviour == "garbage" else "error [x] no", flush=True)
"""


def test_batch_reader_restarts_after_a_hang_an_exit_and_a_bad_answer(tmp_path: Path) -> None:
    script = tmp_path / "batch.py"
    script.write_text(BATCH, encoding="utf-8")
    out = tmp_path / "out"
    with BatchReader(f"{PYTHON} {shlex.quote(str(script))}", timeout=2) as reader:
        refused = reader.run(tmp_path / "fine", 0, out, ["a.b", "c.d"])
        assert refused.exit_code == 1 and "error [x] no" in refused.stderr
        assert "rank 0 ignoring 'a.b,c.d'" in refused.stderr
        first = reader._process
        hung = reader.run(tmp_path / "hang", 1, out)
        assert hung.timed_out and "killed after 2 s" in hung.stderr
        exited = reader.run(tmp_path / "exit", 2, out)
        assert exited.exit_code == 1 and "exited without answering" in exited.stderr
        garbage = reader.run(tmp_path / "garbage", 3, out)
        assert not garbage.accepted and "not a batch answer" in garbage.stderr
        again = reader.run(tmp_path / "fine", 4, out)
        assert again.exit_code == 1 and "rank 4" in again.stderr
        assert reader._process is not first  # started again after the hang


def test_batch_reader_loads_like_the_command_form(tmp_path: Path) -> None:
    script = CONFORMANCE / "examples" / "reference_reader.py"
    with BatchReader(f"{PYTHON} {shlex.quote(str(script))} --batch") as reader:
        results, _ = run_vectors(reader, VECTORS, select="valid-tp2-*,version-major-2.0,"
                                 "valid-extension-ignored-by-user")
    assert results and all(r.passed for r in results), [r.message for r in results if
                                                          not r.passed]


def test_quick_checks_each_vector_once_and_few_generated(tmp_path: Path) -> None:
    result = invoke("--reader", f"{PYTHON} {shlex.quote(str(MINIMAL))}", "--quick",
                    "--keep", str(tmp_path / "kept"), "--junit", str(tmp_path / "j.xml"),
                    "--implements", "blake2b")
    assert result.exit_code == 0, result.output
    vectors, generated = ET.parse(tmp_path / "j.xml").getroot().findall("testsuite")
    ranked = [p for p in VECTORS.glob("*/vector.json")
              if json.loads(p.read_text(encoding="utf-8"))["ranks"]]
    assert int(vectors.get("tests", "0")) == len(ranked)  # one check each
    assert "5 generated checkpoints" in result.output


def test_a_failure_names_the_element_and_bytes_that_differ(tmp_path: Path) -> None:
    flips = CONFORMANCE / "broken_readers" / "flips_byte.py"
    reader = CommandReader(f"{PYTHON} {shlex.quote(str(flips))}")
    results, _ = run_vectors(reader, VECTORS, select="valid-tp1-minimal")
    assert not results[0].passed
    assert re.search(r"differs from byte \d+ on \(element \[[\d, ]+\]: expected byte "
                     r"0x[0-9a-f]{2}, got 0x[0-9a-f]{2}\)", results[0].message)


# --- readers that do not -------------------------------------------------------------------


@pytest.mark.parametrize("name", BROKEN)
def test_broken_reader_is_caught_naming_the_requirement(name: str, tmp_path: Path) -> None:
    broken = module(CONFORMANCE / "broken_readers" / f"{name}.py")
    result = run_suite(PythonReader(broken.read, name), vectors=VECTORS, examples=5, seed=0,
                       keep=tmp_path, shrink=False)
    assert not result.ok
    assert broken.BREAKS in result.failed_requirements(), sorted(result.failed_requirements())


def test_nine_broken_readers() -> None:
    assert BROKEN == ["accepts_invalid", "drops_tensor", "flips_byte", "ignores_must_understand",
                      "ignores_rank", "joins_in_manifest_order", "mislabels_dtype",
                      "reads_newer_major", "refuses_joins"]


def test_cli_reports_a_broken_command_per_requirement(tmp_path: Path) -> None:
    script = CONFORMANCE / "broken_readers" / "reads_newer_major.py"
    junit = tmp_path / "junit.xml"
    result = invoke("--reader", f"{PYTHON} {shlex.quote(str(script))}", "--examples", "0",
                    "--select", "version-major-*,valid-tp1-minimal", "--junit", str(junit))
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "FAIL SPEC 4.2 Version rules" in output
    assert "accepted an invalid checkpoint (expected error version-major)" in output
    cases = ET.parse(junit).getroot().iter("testcase")
    failed = {c.get("name"): c.get("classname") for c in cases if c.find("failure") is not None}
    assert failed == {"vectors/version-major-0.9/rank-0": "SPEC 4.2",
                      "vectors/version-major-2.0/rank-0": "SPEC 4.2"}


def test_smallest_failing_generated_checkpoint_is_kept(tmp_path: Path) -> None:
    broken = module(CONFORMANCE / "broken_readers" / "drops_tensor.py")
    results, kept, _ = run_generated(PythonReader(broken.read), examples=10, seed=0,
                                     keep=tmp_path)
    failures = [r for r in results if not r.passed]
    assert failures and kept == tmp_path / "generated-seed-0"
    summary = json.loads((kept / "failure.json").read_text(encoding="utf-8"))
    # shrunk: one rank holding one tensor with data, which the reader drops
    assert summary["checkpoint"]["layout"]["tp_size"] == 1
    assert len(summary["checkpoint"]["tensors"]) == 1
    assert failures[0].checkpoint == str(kept / "valid" / "checkpoint")
    assert shardspec.validate(kept / "valid" / "checkpoint", checksums=True).ok
    expected = read_output(kept / "valid" / "expected" / "rank-0.safetensors")
    assert len(expected) == 1
    assert not list(tmp_path.glob(".*partial"))


#: Generated checkpoints of a default ``shardspec conformance`` run (the ci profile's).
DEFAULT_EXAMPLES = PROFILES["ci"][0]


@pytest.mark.parametrize("name", ["refuses_joins", "joins_in_manifest_order"])
def test_generated_part_alone_catches_a_reader_that_mishandles_joins(name: str, tmp_path: Path
                                                                     ) -> None:
    """Issue 50 item 7: a reader that refuses every rank holding several pieces of one tensor
    passed all the generated checkpoints of runs at seeds 1 and 2. The generated part alone
    (no vectors) of a default run now catches it at both seeds, and a reader that joins in
    manifest order rather than by offset too."""
    broken = module(CONFORMANCE / "broken_readers" / f"{name}.py")
    for seed in (1, 2):
        results, kept, run = run_generated(PythonReader(broken.read), seed=seed,
                                           examples=DEFAULT_EXAMPLES, keep=tmp_path,
                                           shrink=False)
        failures = [r for r in results if not r.passed]
        assert failures and kept == tmp_path / f"generated-seed-{seed}", (seed, run, len(results))
        assert run <= DEFAULT_EXAMPLES
        if name == "refuses_joins":
            assert all("refused a valid checkpoint" in f.message and "piece-duplicate" in
                       f.message for f in failures), [f.message for f in failures]
        else:  # loaded, with another tensor's bytes than the join's
            assert all(re.search(r"differs from byte \d+", f.message) for f in failures)


def test_a_reader_refusing_joins_is_shown_a_shrunk_checkpoint_naming_7_2(tmp_path: Path
                                                                        ) -> None:
    """The failure the generated part keeps for a reader that refuses joins is shrunk to a
    readable one: one rank, one tensor held as two pieces; the report blames SPEC 7.2."""
    broken = module(CONFORMANCE / "broken_readers" / "refuses_joins.py")
    results, kept, _ = run_generated(PythonReader(broken.read), examples=DEFAULT_EXAMPLES,
                                     seed=2, keep=tmp_path)
    failures = [r for r in results if not r.passed]
    assert failures and kept == tmp_path / "generated-seed-2"
    assert {f.requirement for f in failures} == {"7.2"}, [f.message for f in failures]
    summary = json.loads((kept / "failure.json").read_text(encoding="utf-8"))
    assert summary["failures"][0]["requirement"] == "7.2"
    layout, tensors = summary["checkpoint"]["layout"], summary["checkpoint"]["tensors"]
    assert layout["tp_size"] * layout["pp_size"] * layout["ep_size"] == 1, layout
    assert len(tensors) == 1 and tensors[0]["pieces_per_rank"] == 2, tensors
    assert not summary["checkpoint"]["extensions"]
    assert not summary["checkpoint"]["unknown_fields"]
    checkpoint = kept / "valid" / "checkpoint"
    manifest = json.loads((checkpoint / "shardspec.json").read_text(encoding="utf-8"))
    (record,) = manifest["tensors"].values()
    assert [p["rank"] for p in record["pieces"]] == [0, 0]
    assert manifest["format_version"] == format_version()  # the writer's own: 1.3 or later
    assert shardspec.validate(checkpoint, checksums=True).ok
    expected = read_output(kept / "valid" / "expected" / "rank-0.safetensors")
    assert list(expected) == [tensors[0]["name"]]


def _joins_in(manifest: dict[str, Any]) -> set[str]:
    """The kinds of joins (SPEC 7.2 rule 7) a manifest holds."""
    files = {f["path"]: (rank["rank"], i) for rank in manifest["ranks"]
             for i, f in enumerate(rank["files"])}
    found = set()
    for record in manifest["tensors"].values():
        by_rank: dict[int, list[dict[str, Any]]] = {}
        for piece in record.get("pieces", []):
            by_rank.setdefault(piece["rank"], []).append(piece)
        for rank, listed in by_rank.items():
            if len(listed) < 2:
                continue
            found.add("join")
            dim = next(d for d in range(len(record["shape"]))
                       if len({p["offset"][d] for p in listed}) > 1)
            ordered = sorted(listed, key=lambda p: p["offset"][dim])
            found.add("rows" if dim == 0 else "columns")
            if any(a["offset"][dim] + a["shape"][dim] < b["offset"][dim]
                   for a, b in zip(ordered, ordered[1:], strict=False)):
                found.add("parts apart")  # a fused tensor's parts: pieces not adjacent
            if record["dtype"] in ("F4", "F6_E2M3", "F6_E3M2"):
                found.add("sub-byte")
            replicas = [p.get("replica", 0) for p in listed]
            if any(replicas):
                found.add("replicas")
                if not all(replicas):
                    found.add("some pieces replicas")  # as K and V under GQA
            if listed != ordered:
                found.add("manifest order")
            if sorted(listed, key=lambda p: files[p["file"]]) != ordered:
                assert all(files[p["file"]][0] == rank for p in listed)
                found.add("file order")
    return found


def test_generated_part_holds_joins_of_every_kind(tmp_path: Path) -> None:
    """The generated checkpoints of default runs at seeds 1 and 2 hold many joins, of every
    kind: fused parts, GQA-like replicas, column joins, sub-byte dtypes, pieces listed and
    filed against their offsets' order. The minimal reader loads each rank as expected."""
    reader = module(MINIMAL)
    seen: list[set[str]] = []

    def read(checkpoint: str, rank: int, output: str, ignore: Any) -> None:
        reader.read(checkpoint, rank, output, ignore)  # refuses a broken copy
        if rank == 0:  # each valid checkpoint once
            seen.append(_joins_in(json.loads(
                (Path(checkpoint) / "shardspec.json").read_text(encoding="utf-8"))))

    for seed in (1, 2):
        results, kept, run = run_generated(PythonReader(read), examples=DEFAULT_EXAMPLES,
                                           seed=seed, keep=tmp_path)
        assert kept is None and run == DEFAULT_EXAMPLES, [
            r.message for r in results if not r.passed][:3]
    assert len(seen) >= 2 * DEFAULT_EXAMPLES  # (an example Hypothesis drops is seen too)
    assert sum("join" in kinds for kinds in seen) >= len(seen) // 3
    assert set().union(*seen) == {"join", "rows", "columns", "parts apart", "sub-byte",
                                  "replicas", "some pieces replicas", "manifest order",
                                  "file order"}


def test_generated_part_is_reproducible_from_the_seed(tmp_path: Path) -> None:
    reader = PythonReader(module(MINIMAL).read)

    def run(seed: int) -> list[tuple[str, bool]]:
        results, _, _ = run_generated(reader, examples=4, seed=seed, keep=tmp_path)
        return [(r.check, r.passed) for r in results]

    assert run(7) == run(7)


# --- the protocol ----------------------------------------------------------------------------


def test_a_hanging_reader_is_killed_at_the_time_limit(tmp_path: Path) -> None:
    reader = CommandReader(f"{PYTHON} -c 'import time; time.sleep(60)'", timeout=0.5)
    outcome = reader.run(VECTORS / "valid-tp1-minimal" / "checkpoint", 0, tmp_path / "out")
    assert outcome.timed_out and outcome.seconds < 30
    requirements, passed, message = judge_refusal(outcome, section="2.2", code="x")
    assert not passed and "timed out" in message


def test_shell_syntax_runs_under_sh(tmp_path: Path) -> None:
    reader = CommandReader(f"cd {shlex.quote(str(MINIMAL.parent))} && {PYTHON} "
                           "minimal_reader.py")
    outcome = reader.run(VECTORS / "valid-tp1-minimal" / "checkpoint", 0, tmp_path / "out")
    assert outcome.accepted, outcome.stderr
    assert outcome.output == read_output(VECTORS / "valid-tp1-minimal" / "expected" /
                                         "rank-0.safetensors")


def test_ignored_extensions_reach_the_reader_through_the_environment(tmp_path: Path) -> None:
    reader = CommandReader(f"{PYTHON} {shlex.quote(str(MINIMAL))}")
    root = VECTORS / "valid-extension-ignored-by-user" / "checkpoint"
    assert not reader.run(root, 0, tmp_path / "out").accepted
    outcome = reader.run(root, 0, tmp_path / "out", ["org.example.provenance"])
    assert outcome.accepted and "extension-ignored" in outcome.stderr


def test_output_that_is_not_safetensors_breaks_the_protocol(tmp_path: Path) -> None:
    def garbage(checkpoint: str, rank: int, output: str, ignore: Any) -> None:
        Path(output).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")

    outcome = PythonReader(garbage).run(VECTORS / "valid-tp1-minimal" / "checkpoint", 0,
                                        tmp_path / "out")
    assert outcome.accepted and outcome.output is None and outcome.output_error
    assert judge_load(outcome, {}, rank=0, sections=("7.2",))[:2] == (("protocol",), False)
    with pytest.raises(OutputError):
        read_output(tmp_path / "out")


def test_a_refusal_that_leaves_output_breaks_1_1(tmp_path: Path) -> None:
    def half(checkpoint: str, rank: int, output: str, ignore: Any) -> None:
        write_output(output, {"w": ("U8", (1,), b"\x01")})
        raise ValueError("refused, too late")

    outcome = PythonReader(half).run(VECTORS / "valid-tp1-minimal" / "checkpoint", 0,
                                     tmp_path / "out")
    assert not outcome.accepted and "too late" in outcome.stderr
    assert judge_refusal(outcome, section="7.3", code="coverage-gap")[:2] == (("1.1",), False)


def test_cli_cannot_run_without_vectors_or_checks(tmp_path: Path) -> None:
    assert invoke("--reader", "no-such-reader-command", "--examples", "0").exit_code == 2
    assert invoke("--reader", "true", "--vectors", str(tmp_path)).exit_code == 2
    assert invoke("--reader", "true", "--no-vectors", "--examples", "0").exit_code == 2
    assert invoke("--reader", "true", "--select", "no-such-vector", "--examples",
                  "0").exit_code == 2


# --- the library: profiles and strategies ----------------------------------------------------


def test_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDSPEC_HYPOTHESIS_PROFILE", "thorough")
    assert profile_name() == "thorough" and conformance_defaults() == (500, None)
    monkeypatch.setenv("SHARDSPEC_HYPOTHESIS_PROFILE", "nightly")
    with pytest.raises(ValueError):
        profile_name()
    monkeypatch.delenv("SHARDSPEC_HYPOTHESIS_PROFILE")
    assert conformance_defaults() == (25, 0)
    ci, thorough = settings.get_profile("ci"), settings.get_profile("thorough")
    assert ci.derandomize and ci.database is None and ci.max_examples == 40
    assert not thorough.derandomize and thorough.max_examples == 1000


def test_every_mutation_kind_has_a_distinct_name() -> None:
    kinds = mutation_kinds()
    assert len(kinds) == len(set(kinds)) >= 30


#: Half the profile's examples: each writes a checkpoint (20 under ci, 500 under thorough).
PROPERTY = settings(max_examples=max(settings.default.max_examples // 2, 1), deadline=None,
                    suppress_health_check=list(HealthCheck))


@PROPERTY
@given(data=st.data())
def test_broken_checkpoints_are_refused_with_their_code(data: st.DataObject) -> None:
    """Each broken checkpoint the strategies derive is refused by the reference with the code
    it declares: by the validator, and by the reader on every rank it lists."""
    with tempfile.TemporaryDirectory() as tmp:
        kind = data.draw(st.sampled_from(mutation_kinds()))
        written = data.draw(checkpoint_specs()).write(Path(tmp) / "valid")
        mutation = data.draw(broken_checkpoints(written, kind))
        root = Path(tmp) / "broken"
        shutil.copytree(written.path, root, symlinks=True)
        mutation.apply(root)
        ignore = written.ignore_extensions
        report = shardspec.validate(root, checksums=True, ignore_extensions=ignore)
        assert mutation.code in {f.code for f in report.errors}, (
            mutation.description, [str(f) for f in report.errors])
        for rank in mutation.ranks:
            with pytest.raises(shardspec.ShardspecError) as caught:
                shardspec.open(root, ignore_extensions=ignore).load_rank(rank, "cpu",
                                                                          verify=True)
            assert caught.value.code == mutation.code, mutation.description


# --- writer properties -----------------------------------------------------------------------


@PROPERTY
@given(spec=checkpoint_specs())
def test_writer_output_validates_and_its_manifest_round_trips(spec: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        manifest = spec.save(root)
        report = shardspec.validate(root, checksums=True, ignore_extensions=spec.ignored)
        assert report.ok, [str(f) for f in report.errors]
        assert {f.code for f in report.warnings} <= {"extension-ignored"}
        on_disk = (root / "shardspec.json").read_bytes()
        parsed = parse_manifest(on_disk, ignore_extensions=spec.ignored).manifest
        assert parsed == manifest  # parse(serialize(m)) == m
        assert parsed.to_json() == on_disk  # serialize(parse(bytes)) == bytes
        again = parse_manifest(parsed.to_json(), ignore_extensions=spec.ignored).manifest
        assert again == parsed and again.to_json() == on_disk  # stable byte for byte


@PROPERTY
@given(spec=checkpoint_specs())
def test_generated_checkpoints_load_as_expected_by_the_reference(spec: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        written = spec.write(Path(tmp) / "ckpt")
        checkpoint = shardspec.open(written.path, ignore_extensions=written.ignore_extensions)
        assert checkpoint.world_size == written.world_size
        assert shardspec.validate(written.path, checksums=True,
                                  ignore_extensions=written.ignore_extensions).ok
        out = Path(tmp) / "out.safetensors"
        for rank, expected in written.expected.items():
            reference_read(str(written.path), rank, str(out), written.ignore_extensions)
            assert read_output(out) == expected


def test_report_counts_vectors_and_generated_checks_per_section_and_names_untested_ones(
) -> None:
    from io import StringIO

    from rich.console import Console

    from shardspec.testing.checks import CheckResult
    from shardspec.testing.runner import SuiteResult, print_report

    result = SuiteResult(reader="r", results=[
        CheckResult("vectors/a/rank-0", ("7.2", "7.3"), True),
        CheckResult("vectors/b/rank-0", ("7.2",), False, message="wrong"),
        CheckResult("generated/1/rank-0", ("7.2",), True, part="generated"),
    ])
    coverage = result.coverage()
    assert coverage["7.2"] == (2, 1) and coverage["7.3"] == (1, 0)
    assert coverage["8.3"] == (0, 0)  # a section of the SPEC no check exercised
    buffer = StringIO()
    print_report(result, Console(file=buffer, width=200, highlight=False))
    rows = {line.split("│")[1].strip(): line for line in buffer.getvalue().splitlines()
            if line.startswith("│")}
    assert "untested" in rows["8.3"] and "untested" not in rows["7.2"]
    assert [c.strip() for c in rows["7.2"].split("│")[3:7]] == ["2", "1", "2", "1"]
