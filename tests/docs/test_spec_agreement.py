"""SPEC.md, the JSON Schema, the schema examples and the reference constants say the same thing.

SPEC.md is parsed with the small helpers at the top: a heading finder, a section slicer, a
markdown table reader and a fenced-block extractor.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from shardspec.format import dtypes, errors, limits

ROOT = Path(__file__).parents[2]
SPEC_PATH = ROOT / "SPEC.md"
SCHEMA_PATH = ROOT / "schema" / "manifest.schema.json"
EXAMPLES = ROOT / "schema" / "examples"
PACKAGE = ROOT / "reference" / "shardspec"

#: Limits stated in prose in their own sections rather than in the SPEC 12 table.
LIMITS_IN_PROSE = {"MANIFEST_NAME", "SUPPORTED_MAJOR", "SUPPORTED_MINOR", "DEFAULT_MAX_FILE_SIZE"}

#: The fixed section map: code and error messages cite these numbers.
SECTION_MAP = {
    "1": "Introduction", "1.1": "Conventions", "1.2": "Terms",
    "2": "Checkpoint directory", "2.1": "Contents", "2.2": "Paths", "2.3": "Commit marker",
    "2.4": "Object storage",
    "3": "Manifest encoding", "3.1": "The manifest object", "3.2": "Encoding and syntax",
    "3.3": "I-JSON restrictions", "3.4": "Size and depth limits", "3.5": "The JSON Schema",
    "4": "Versioning", "4.1": "format_version", "4.2": "Reader rules", "4.3": "Unknown fields",
    "4.4": "Extensions",
    "5": "Parallel layout", "5.1": "Sizes", "5.2": "Rank order", "5.3": "Rank records",
    "6": "Data files", "6.1": "Rank-to-file mapping", "6.2": "Default file names",
    "6.3": "safetensors container rules", "6.4": "Dtypes", "6.5": "Sub-byte packing",
    "7": "Tensors", "7.1": "Tensor records", "7.2": "Pieces", "7.3": "Coverage",
    "7.4": "Replicas", "7.5": "Rank-local tensors", "7.6": "Aliases",
    "7.7": "Scalars and zero-size tensors",
    "8": "Quantization", "8.1": "The record", "8.2": "Logical dtype and shape",
    "8.3": "Reader rules",
    "8.4": "Tied tensors",
    "9": "Integrity", "9.1": "Sizes", "9.2": "Checksums",
    "9.3": "Objects that change while read",
    "10": "Writing", "10.1": "Commit protocol", "10.2": "Rewriting a directory",
    "10.3": "Writer duties", "10.4": "Writing to object storage",
    "11": "Reading", "11.1": "Reader procedure", "11.2": "Device placement",
    "11.3": "Resharding",
    "12": "Limits", "13": "Error codes", "14": "Changelog",
}

_HEADING = re.compile(r"^(#{2,3}) (\d+(?:\.\d+)?)\.? (.+?)\s*$")
_FENCE = re.compile(r"^```(\S*)\s*$")
_CITATION = re.compile(r"SPEC (\d+(?:\.\d+)?)")


# --- SPEC.md helpers ------------------------------------------------------------------------


@cache
def spec_text() -> str:
    return SPEC_PATH.read_text(encoding="utf-8")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(index, line) for every line outside fenced code blocks."""
    out, fenced = [], False
    for index, line in enumerate(text.splitlines()):
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((index, line))
    return out


def headings(text: str) -> dict[str, tuple[int, str, int]]:
    """Section number -> (level, title, line index) for numbered ``##``/``###`` headings."""
    found: dict[str, tuple[int, str, int]] = {}
    for index, line in prose_lines(text):
        match = _HEADING.match(line)
        if match:
            number = match[2]
            assert number not in found, f"section {number} has two headings"
            found[number] = (len(match[1]), match[3], index)
    return found


def section_body(text: str, number: str) -> str:
    """The lines of a section, up to the next heading of the same or a higher level."""
    level, _, start = headings(text)[number]
    lines = text.splitlines()
    end = len(lines)
    for index, line in prose_lines(text):
        if index > start and re.match(rf"^#{{1,{level}}} ", line):
            end = index
            break
    return "\n".join(lines[start + 1 : end])


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def markdown_table(body: str, header: str) -> list[dict[str, str]]:
    """The rows of the table in ``body`` whose header row is exactly ``header``."""
    lines = [line for _, line in prose_lines(body)]
    for index, line in enumerate(lines):
        if line.strip() == header:
            columns = _cells(line)
            assert re.fullmatch(r"\|( *:?-+:? *\|)+", lines[index + 1].strip()), "no separator"
            rows = []
            for row in lines[index + 2 :]:
                if not row.strip().startswith("|"):
                    break
                cells = _cells(row)
                assert len(cells) == len(columns), f"ragged row: {row}"
                rows.append(dict(zip(columns, cells, strict=True)))
            return rows
    raise AssertionError(f"no table with header {header!r}")


def unticked(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"{cell!r} is not a single code span"
    return match[1]


def fenced_blocks(text: str, language: str) -> list[str]:
    """The contents of every fenced block opened with exactly ```<language>."""
    blocks, current, fenced = [], None, False
    for line in text.splitlines():
        match = _FENCE.match(line.strip())
        if match:
            if not fenced:
                fenced, current = True, ([] if match[1] == language else None)
            else:
                if current is not None:
                    blocks.append("\n".join(current))
                fenced, current = False, None
            continue
        if current is not None:
            current.append(line)
    return blocks


# --- schema helpers -------------------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


def validator() -> Draft202012Validator:
    return Draft202012Validator(schema())  # no format checker: "format" asserts nothing


def schema_errors(instance: Any) -> list[str]:
    return [error.message for error in validator().iter_errors(instance)]


def valid_examples() -> list[Path]:
    return sorted((EXAMPLES / "valid").glob("*.json"))


def invalid_examples() -> list[Path]:
    return sorted((EXAMPLES / "invalid").glob("*.json"))


def limit_sections() -> dict[str, str]:
    """Constant name -> the section its ``#: SPEC x.y:`` comment in limits.py cites."""
    sections: dict[str, str] = {}
    current = None
    for line in (PACKAGE / "format" / "limits.py").read_text(encoding="utf-8").splitlines():
        cited = re.match(r"#: SPEC (\d+(?:\.\d+)?)", line)
        if cited:
            current = cited[1]
        assigned = re.match(r"([A-Z][A-Z0-9_]*) = ", line)
        if assigned:
            assert current is not None, f"{assigned[1]} cites no SPEC section"
            sections[assigned[1]] = current
    return sections


# --- the spec's shape -----------------------------------------------------------------------


def test_spec_headings_follow_the_fixed_section_map() -> None:
    found = {number: title for number, (_, title, _) in headings(spec_text()).items()}
    assert found == SECTION_MAP
    for number, (level, _, _) in headings(spec_text()).items():
        assert level == (2 if "." not in number else 3), f"section {number} has the wrong level"


def test_spec_opens_with_the_supported_format_version() -> None:
    version = f"{limits.SUPPORTED_MAJOR}.{limits.SUPPORTED_MINOR}"
    head = "\n".join(spec_text().splitlines()[:5])
    assert f"Format version {version}. Status:" in head


def test_changelog_lists_the_supported_format_version() -> None:
    version = f"{limits.SUPPORTED_MAJOR}.{limits.SUPPORTED_MINOR}"
    assert re.search(rf"\*\*{re.escape(version)}\*\* \(\d{{4}}-\d\d-\d\d\)",
                     section_body(spec_text(), "14"))


def test_every_section_cited_in_code_and_schema_exists_in_spec() -> None:
    numbers = set(headings(spec_text()))
    cited = {(code, c.section) for code, c in errors.CODES.items()}
    for path in [*sorted(PACKAGE.rglob("*.py")), SCHEMA_PATH]:
        text = path.read_text(encoding="utf-8")
        cited |= {(str(path.relative_to(ROOT)), number) for number in _CITATION.findall(text)}
    missing = sorted((where, number) for where, number in cited if number not in numbers)
    assert not missing, f"cited sections without a SPEC.md heading: {missing}"


_RULE_CITATION = re.compile(r"SPEC \[?(\d+\.\d+)\]?(?:\([^)\s]*\))? rules? (\d+)"
                            r"((?:(?:, | and |–)\d+(?![.\d]))*)")


@cache
def _rules(number: str) -> frozenset[int]:
    """The numbers of a section's numbered rules (its top-level ordered list)."""
    return frozenset(int(m) for m in re.findall(r"^(\d+)\. ", section_body(spec_text(), number),
                                                 re.M))


def test_every_rule_cited_as_spec_section_rule_exists() -> None:
    """``SPEC 11.3 rule 11`` in code, docs or tests names a numbered rule of that section
    (the changelog once cited a rule that SPEC.md did not have)."""
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "tests").rglob(
        "*.py"), *(ROOT / "conformance").rglob("*.py"), ROOT / "README.md", SPEC_PATH]
    missing = set()
    for path in files:
        for match in _RULE_CITATION.finditer(path.read_text(encoding="utf-8")):
            cited = {int(match[2]), *map(int, re.findall(r"\d+", match[3]))}
            missing |= {(str(path.relative_to(ROOT)), match[1], n)
                        for n in cited - _rules(match[1])}
    assert not missing, f"rules cited that their SPEC.md section does not have: {missing}"


def test_attention_head_names_in_spec_equal_the_heads_module() -> None:
    """SPEC 11.3 rule 11's informative names are the ones format/heads.py knows."""
    from shardspec.format import heads

    rule = section_body(spec_text(), "11.3").split("11. *Attention heads.*")[1]
    informative = rule.split("*Informative:*")[1].split("It reads")[0]
    split, fused = informative.split("heads);")
    assert set(re.findall(r"`(\w+)`", split)) == heads._QUERY | heads._KV | heads._OUTPUT
    assert set(re.findall(r"`(\w+)`", fused)) == heads._FUSED


def test_limit_comments_cite_existing_sections() -> None:
    numbers = set(headings(spec_text()))
    assert set(limit_sections()) == set(limits.__all__)
    assert set(limit_sections().values()) <= numbers


# --- JSON in the spec and the schema examples -------------------------------------------------


def test_spec_has_json_examples_including_appendix_a() -> None:
    assert len(fenced_blocks(spec_text(), "json")) >= 2
    appendix = spec_text().split("## Appendix A.", 1)[1]
    assert len(fenced_blocks(appendix, "json")) == 1


@pytest.mark.parametrize("index", range(len(fenced_blocks(spec_text(), "json"))))
def test_every_json_block_in_spec_is_a_schema_valid_manifest(index: int) -> None:
    block = fenced_blocks(spec_text(), "json")[index]
    assert schema_errors(json.loads(block)) == []


def test_appendix_a_shows_every_kind_of_tensor_record() -> None:
    appendix = spec_text().split("## Appendix A.", 1)[1]
    manifest = json.loads(fenced_blocks(appendix, "json")[0])
    assert manifest["layout"]["tp_size"] == 2
    tensors = manifest["tensors"].values()
    assert manifest["tensors"]["lm_head.weight"] == {"alias_of": "model.embed_tokens.weight"}
    assert any(t.get("rank_local") for t in tensors)
    assert any(t.get("shape") == [] for t in tensors)
    assert any(0 in t.get("shape", [1]) for t in tensors)
    replicas = {p.get("replica", 0) for t in tensors for p in t.get("pieces", [])}
    assert {0, 1} <= replicas


def test_there_are_enough_schema_examples() -> None:
    assert len(valid_examples()) >= 6
    assert len(invalid_examples()) >= 12


@pytest.mark.parametrize("path", valid_examples(), ids=lambda p: p.stem)
def test_valid_example_validates_against_schema(path: Path) -> None:
    assert schema_errors(json.loads(path.read_text(encoding="utf-8"))) == []


@pytest.mark.parametrize("path", invalid_examples(), ids=lambda p: p.stem)
def test_invalid_example_fails_schema_and_names_an_existing_section(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert set(case) == {"description", "section", "manifest"}
    assert case["description"]
    assert case["section"] in headings(spec_text())
    assert schema_errors(case["manifest"]) != []


# --- tables against the reference constants ----------------------------------------------------


def test_limits_table_equals_limits_module_both_ways() -> None:
    rows = markdown_table(section_body(spec_text(), "12"), "| limit | value | section |")
    table = {unticked(row["limit"]): row for row in rows}
    assert len(table) == len(rows), "a limit is listed twice"
    expected = {name: getattr(limits, name) for name in limits.__all__}
    expected = {k: v for k, v in expected.items() if k not in LIMITS_IN_PROSE}
    assert set(table) == set(expected)
    for name, value in expected.items():
        assert re.fullmatch(r"\d+", table[name]["value"]), f"{name}: write plain digits"
        assert int(table[name]["value"]) == value, name
        assert table[name]["section"] == limit_sections()[name], name


def test_limits_stated_in_prose_appear_in_spec() -> None:
    text = spec_text()
    assert f"`{limits.MANIFEST_NAME}`" in section_body(text, "2.1")
    assert str(limits.DEFAULT_MAX_FILE_SIZE) in section_body(text, "6.1")
    assert f'"{limits.SUPPORTED_MAJOR}.{limits.SUPPORTED_MINOR}"' in section_body(text, "4.1")
    for name in ("SUPPORTED_MAJOR", "SUPPORTED_MINOR"):  # restated in section 12's prose
        for section in ("4.1", "12"):
            stated = re.findall(rf"`{name}`\s+(?:=\s+)?(\d+)", section_body(text, section))
            assert stated == [str(getattr(limits, name))], (name, section, stated)


def test_error_code_table_equals_registry_both_ways() -> None:
    header = "| code | severity | section | meaning |"
    rows = markdown_table(section_body(spec_text(), "13"), header)
    table = {unticked(row["code"]): (row["severity"], row["section"]) for row in rows}
    assert len(table) == len(rows), "a code is listed twice"
    registry = {code: (c.severity, c.section) for code, c in errors.CODES.items()}
    assert table == registry
    assert all(row["meaning"] for row in rows)


def test_every_error_code_is_used_in_the_section_it_belongs_to() -> None:
    for code, c in errors.CODES.items():
        assert f"`{code}`" in section_body(spec_text(), c.section), (code, c.section)


def test_dtype_table_equals_dtypes_module_and_schema_enum() -> None:
    rows = markdown_table(section_body(spec_text(), "6.4"), "| dtype | bits | meaning |")
    table = {row["dtype"]: int(row["bits"]) for row in rows}
    assert len(table) == len(rows), "a dtype is listed twice"
    assert table == {name: d.bits for name, d in dtypes.DTYPES.items()}
    assert [row["dtype"] for row in rows] == schema()["$defs"]["dtype"]["enum"]
    assert all(row["meaning"] for row in rows)


# --- the schema itself ---------------------------------------------------------------------------


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema())


def test_schema_id_ends_with_the_supported_version() -> None:
    version = f"{limits.SUPPORTED_MAJOR}.{limits.SUPPORTED_MINOR}"
    assert schema()["$id"].endswith(f":{version}")
    assert f"`{schema()['$id']}`" in section_body(spec_text(), "3.5")


def test_schema_path_pattern_rejects_dot_dot_after_a_newline() -> None:
    pattern = re.compile(schema()["$defs"]["path"]["pattern"])
    assert pattern.search("a/b.safetensors")
    for bad in ["a\n/../b", "x\n//y", "../a", "a/./b", "/a", "a\\b", "a/"]:
        assert not pattern.search(bad), bad
