"""MkDocs hooks: the parts of the documentation generated at build time from their one source.

Markers, each alone on a line of a page, are replaced before the page is rendered:

- ``<!-- cli-reference -->``: every ``shardspec`` command, from the Typer app itself;
- ``<!-- schema-reference -->``: every field of ``schema/manifest.schema.json``;
- ``<!-- benchmark-summary -->``: the first results table of ``benchmarks/README.md``, condensed;
- ``<!-- include PATH -->``: a repository file's Markdown, with links to repository files
  rewritten for the site, and headings one level down where the page has a title above it;
- ``<!-- source PATH NAME -->``: the source of top-level function, class or constant ``NAME``
  of Python file ``PATH``, as a code block (found by name with ``ast``, not by line numbers);
- ``<!-- architectures -->``: the architectures ``convert`` takes with no plan, from the test
  matrix itself (``tests/helpers/architectures.py``) and the plan each resolves to;
- ``<!-- quantization -->``: the quantized layouts the vLLM plugin is tested with, from that
  matrix (``tests/helpers/quantized_models.py``).

Two files are added to the site: ``schema/manifest.schema.json`` (the schema itself, which
SPEC.md links to) and ``assets/benchmark-load.svg`` (a bar chart of the same results table).
A missing file, name or table stops the build (:class:`PluginError`), so ``--strict`` catches it.
"""

from __future__ import annotations

import ast
import html
import json
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schema" / "manifest.schema.json"
BENCHMARKS = REPO / "benchmarks" / "README.md"
CHART = "assets/benchmark-load.svg"

MARKER = re.compile(r"^<!-- (cli-reference|schema-reference|benchmark-summary|include|source"
                    r"|architectures|quantization)"
                    r"((?: \S+)*) -->[ \t]*$", re.M)


# --- MkDocs events ---------------------------------------------------------------------------


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "schema/manifest.schema.json", abs_src_path=str(SCHEMA)))
    files.append(File.generated(config, CHART, content=benchmark_chart()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)

    def replace(match: re.Match[str]) -> str:
        kind, args = match[1], match[2].split()
        if kind == "cli-reference":
            return cli_reference()
        if kind == "schema-reference":
            return schema_reference()
        if kind == "benchmark-summary":
            return benchmark_summary()
        if kind == "include" and len(args) == 1:
            # headings go one level down under a page's own title, else stay as they are
            titled = re.search(r"^# ", markdown[:match.start()], re.M) is not None
            return include(args[0], page_dir, shift=titled)
        if kind == "source" and len(args) == 2:
            return source(args[0], args[1])
        if kind == "architectures":
            return architectures_table()
        if kind == "quantization":
            return quantization_table()
        raise PluginError(f"{page.file.src_uri}: bad marker {match[0]!r}")

    return MARKER.sub(replace, markdown)


_ROLE = re.compile(r":(?:func|mod|class|meth|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    # Docstrings use Sphinx roles (:func:`x`); mkdocstrings renders them as ":func:<code>x</code>".
    # As in Sphinx, a leading ~ shows only the last component of the name.
    return _ROLE.sub(lambda m: f"<code>{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}</code>",
                     content)


# --- files of the repository -----------------------------------------------------------------


def repo_file(path: str) -> Path:
    file = (REPO / path).resolve()
    if REPO not in file.parents or not file.is_file():
        raise PluginError(f"docs: {path} is not a file of the repository")
    return file


_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)")


def include(path: str, page_dir: str, *, shift: bool) -> str:
    """A Markdown file of the repository, links made site links, and with ``shift`` its
    headings one level down."""
    lines, fenced = [], False
    base = posixpath.dirname(path)
    for line in repo_file(path).read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            if shift and re.match(r"#{1,5} ", line):
                line = "#" + line
            line = _LINK.sub(lambda m: _site_link(m[1], m[2], base, page_dir), line)
        lines.append(line)
    return "\n".join(lines)


def _site_link(text: str, target: str, base: str, page_dir: str) -> str:
    """A link of an included file: to SPEC.md or README.md -> their pages; to another file of
    the repository -> its path as code (the site does not carry it); anything else unchanged."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return f"[{text}]({target})"
    file, _, anchor = target.partition("#")
    repo_path = posixpath.normpath(posixpath.join(base, file))
    pages = {"SPEC.md": "spec.md", "README.md": "index.md"}
    if repo_path in pages:
        link = posixpath.relpath(pages[repo_path], page_dir or ".")
        return f"[{text}]({link}{'#' + anchor if anchor else ''})"
    if repo_path.startswith("docs/"):
        return f"[{text}]({posixpath.relpath(repo_path[5:], page_dir or '.')})"
    if (REPO / repo_path).exists():
        label = text.strip("`")
        if repo_path.endswith(label.rstrip("/")):  # the text is the path, or its tail
            return f"`{repo_path}{'/' if label.endswith('/') else ''}`"
        return f"{text} (`{repo_path}`)"
    return f"[{text}]({target})"  # left for --strict to report


def source(path: str, name: str) -> str:
    """The source of a top-level definition, as a fenced code block titled with its origin."""
    text = repo_file(path).read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        if name in names:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            lines = text.splitlines()[first - 1:node.end_lineno]
            return (f'```python title="{path}: {name}" linenums="{first}"\n'
                    + "\n".join(lines) + "\n```")
    raise PluginError(f"docs: {path} has no top-level {name!r}")


# --- the command line ------------------------------------------------------------------------


def cli_reference() -> str:
    """Every command of ``shardspec.cli.app``: usage, help and options, as the CLI has them."""
    import typer

    from shardspec.cli import app

    group: Any = typer.main.get_command(app)
    context_class = group.context_class
    root = context_class(group, info_name="shardspec")
    names = group.list_commands(root)
    out = ["| command | what it does |", "| --- | --- |"]
    for name in names:
        command = group.get_command(root, name)
        out.append(f"| [`shardspec {name}`](#{name}) | {_cell(_first_line(command.help))} |")
    out += ["", "## Global options", "", "```text",
            "shardspec " + " ".join(group.collect_usage_pieces(root)), "```", ""]
    out += _options(group, root)
    for name in names:
        command = group.get_command(root, name)
        context = context_class(command, info_name=name, parent=root)
        usage = " ".join(["shardspec", name, *command.collect_usage_pieces(context)])
        out += ["", f"## `shardspec {name}` {{#{name}}}", "", _paragraphs(command.help or ""),
                "", "```text", usage, "```", ""]
        out += _options(command, context)
    return "\n".join(out)


def _options(command: Any, context: Any) -> list[str]:
    rows = []
    for param in command.get_params(context):
        record = param.get_help_record(context)
        if record is None or "--help" in param.opts:
            continue
        decl, text = record
        text, _, extra = text.partition("  [")
        kind = "argument" if not param.opts[0].startswith("-") else "option"
        name = param.opts[0].upper() if kind == "argument" else decl
        note = f" *[{html.escape(extra, quote=False)}*" if extra else ""
        rows.append(f"| `{_cell(name)}` | {_cell(html.escape(text, quote=False))}{note} |")
    if not rows:
        return ["No options."]
    return ["| argument or option | meaning |", "| --- | --- |", *rows]


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n\n")[0].replace("\n", " ")


def _paragraphs(text: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in text.strip().split("\n\n"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- the manifest schema ---------------------------------------------------------------------


def schema_reference() -> str:
    """The manifest's fields and definitions, with types, constraints and descriptions."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    out = [f"**{schema.get('title', 'Manifest')}**: {schema.get('description', '')}", "",
           f"- `$schema`: `{schema['$schema']}`", f"- `$id`: `{schema['$id']}`", "",
           "## Top level {#top-level}", "", _object_table(schema), "",
           "## Definitions {#definitions}", ""]
    for name, definition in schema["$defs"].items():
        out += [f"### `{name}` {{#def-{name}}}", ""]
        if "description" in definition:
            out += [definition["description"], ""]
        if definition.get("type") == "object" and "properties" in definition:
            out += [_object_table(definition), ""]
        else:
            out += [f"Type: {_type(definition)}.", ""]
            constraints = _constraints(definition)
            if constraints:
                out += [f"Constraints: {constraints}.", ""]
        users = sorted(n for n, d in schema["$defs"].items()
                       if f'"#/$defs/{name}"' in json.dumps(d))
        if f'"#/$defs/{name}"' in json.dumps(schema["properties"]):
            users.insert(0, "top level")
        if users:
            links = [f"[{u}](#top-level)" if u == "top level" else f"[`{u}`](#def-{u})"
                     for u in users]
            out += [f"Used by: {', '.join(links)}.", ""]
    return "\n".join(out)


def _object_table(definition: dict[str, Any]) -> str:
    required = set(definition.get("required", []))
    rows = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    for field, spec in definition["properties"].items():
        text = spec.get("description", "")
        if "$ref" in spec and not text:
            text = f"See [`{_ref(spec)}`](#def-{_ref(spec)})."
        constraints = _constraints(spec)
        if constraints:
            text = f"{text} {constraints}." if text else f"{constraints}."
        rows.append(f"| `{field}` | {_type(spec)} | {'yes' if field in required else 'no'} "
                    f"| {_cell(text)} |")
    extra = definition.get("additionalProperties")
    if extra is False:
        rows.append("| *(any other)* | | | not allowed |")
    elif isinstance(extra, dict):
        rows.append(f"| *(any other name)* | {_type(extra)} | no | {_cell(_constraints(extra))} |")
    return "\n".join(rows)


def _ref(spec: dict[str, Any]) -> str:
    return str(spec["$ref"]).rsplit("/", 1)[-1]


def _code(value: Any) -> str:
    """Inline code safe inside Markdown and table cells (patterns hold `|`, `[`, `(`, `\\`):
    every character that is not a letter, digit or space becomes a character reference."""
    text = value if isinstance(value, str) else json.dumps(value)
    return "<code>" + "".join(c if c.isalnum() or c == " " else f"&#{ord(c)};"
                              for c in text) + "</code>"


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        return f"[`{_ref(spec)}`](#def-{_ref(spec)})"
    if "const" in spec:
        return f"{_code(spec['const'])} (constant)"
    if "enum" in spec:
        return "one of " + ", ".join(_code(v) for v in spec["enum"])
    if "oneOf" in spec:
        return "exactly one of " + ", ".join(_type(s) for s in spec["oneOf"])
    if "if" in spec and "then" in spec:
        return _conditional(spec)
    kind = spec.get("type", "any")
    if kind == "array" and "items" in spec:
        return f"array of {_type(spec['items'])}"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        names = spec.get("propertyNames")
        key = f"{_type(names)} names" if names and "$ref" in names else "names"
        return f"object: {key} → {_type(spec['additionalProperties'])}"
    return str(kind)


def _conditional(spec: dict[str, Any]) -> str:
    """``if``/``then``/``else`` chains on members present (a tensor record's kind, SPEC 4.3)."""
    parts = []
    while "if" in spec and "then" in spec:
        members = ", ".join(_code(name) for name in spec["if"].get("required", []))
        parts.append(f"{_type(spec['then'])} if it has {members}")
        spec = spec.get("else", {})
    if spec:
        parts.append(_type(spec))
    return "; else ".join(parts)


def _constraints(spec: dict[str, Any]) -> str:
    parts = []
    for key, label in (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"),
                       ("maxLength", "length ≤"), ("minItems", "items ≥"),
                       ("maxItems", "items ≤")):
        if key in spec:
            parts.append(f"{label} {spec[key]}")
    if "pattern" in spec:
        parts.append(f"matches {_code(spec['pattern'])}")
    if "not" in spec and "const" in spec["not"]:
        parts.append(f"not {_code(spec['not']['const'])}")
    if isinstance(spec.get("propertyNames"), dict) and "pattern" in spec["propertyNames"]:
        parts.append(f"names match {_code(spec['propertyNames']['pattern'])}")
    if spec.get("required") and spec.get("type") == "object" and "properties" in spec \
            and spec.get("description") is None:
        parts.append("requires " + ", ".join(_code(r) for r in spec["required"]))
    return "; ".join(parts)


# --- benchmarks ------------------------------------------------------------------------------

_NEEDED = ("TP", "baseline s", "shardspec s", "raw s")


def benchmark_table() -> tuple[str, list[dict[str, str]]]:
    """The first table of benchmarks/README.md with TP and the three load times: the heading
    above it and its rows (column name -> cell; of repeated names, the first)."""
    heading, lines = "", BENCHMARKS.read_text(encoding="utf-8").splitlines()
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if not line.startswith("|") or i + 1 >= len(lines) or not lines[i + 1].startswith("|-"):
            continue
        header = [c.strip() for c in line.strip().strip("|").split("|")]
        if not all(name in header for name in _NEEDED):
            continue
        rows = []
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            rows.append({name: cells[header.index(name)] for name in header
                         if header.index(name) < len(cells)})
        return heading, rows
    raise PluginError(f"docs: no table with columns {', '.join(_NEEDED)} in {BENCHMARKS}")


def _seconds(cell: str) -> float:
    try:
        return float(cell.rstrip("sx "))
    except ValueError:
        raise PluginError(f"docs: {cell!r} in {BENCHMARKS} is not a number") from None


def benchmark_summary() -> str:
    heading, rows = benchmark_table()
    out = ["| TP | one rank reads | whole-file baseline | shardspec load | plain read of the "
           "rank's bytes into fresh memory | speedup |",
           "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        reads = row.get("rank reads", "")
        whole = row.get("baseline reads", "")
        out.append(f"| {row['TP']} | {reads}{' of ' + whole if whole else ''} "
                   f"| {row['baseline s']} s | {row['shardspec s']} s | {row['raw s']} s "
                   f"| {row.get('speedup', '')} |")
    last = rows[-1]
    if all(last.get(key) for key in ("rank reads", "baseline reads", "of which open s")):
        out += ["", f"At TP={last['TP']}, the rank read {last['rank reads']} instead of "
                f"{last['baseline reads']}. Its load took {last['shardspec s']} s, of which "
                f"{last['of which open s']} s in `open()` (reading and checking the manifest), "
                f"against {last['raw s']} s for a plain read of the same bytes into fresh memory "
                f"and "
                f"{last['baseline s']} s for the baseline."]
    out += ["", f"*Median seconds of one rank's cold-cache load, from the table "
            f"“{heading}” of the [benchmarks](benchmarks.md), where the machine, the method and "
            "the caveats are.*"]
    return "\n".join(out)


def benchmark_chart() -> str:
    """A horizontal grouped bar chart (SVG) of the load times of each TP size."""
    heading, rows = benchmark_table()
    series = [("baseline s", "whole file, then slice (baseline)", "#9e9e9e"),
              ("shardspec s", "shardspec load_rank", "#3f51b5")]
    if rows and "without open: s" in rows[0]:
        series.append(("without open: s", "shardspec, open() subtracted", "#9fa8da"))
    series.append(("raw s", "plain read into fresh memory", "#ff7043"))
    top = max(_seconds(row[key]) for row in rows for key, _, _ in series) or 1.0
    width, left, right, bar, gap, group_gap = 760, 150, 70, 14, 3, 22
    group = len(series) * (bar + gap) + group_gap
    title_h, legend_h = 58, 26 * ((len(series) + 1) // 2) + 10
    height = title_h + group * len(rows) + legend_h + 24
    scale = (width - left - right) / top
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="system-ui, -apple-system, Segoe UI, '
           'Roboto, Helvetica, Arial, sans-serif" font-size="13" role="img" '
           'aria-labelledby="title desc">',
           "<title id=\"title\">One rank's load time by tensor-parallel size</title>",
           f'<desc id="desc">Median seconds from the table "{html.escape(heading)}" of '
           "benchmarks/README.md.</desc>",
           f'<rect width="{width}" height="{height}" rx="8" fill="#ffffff"/>',
           '<text x="20" y="28" font-size="16" font-weight="600" fill="#212121">'
           "One rank's load, median seconds (lower is better)</text>",
           f'<text x="20" y="47" fill="#616161">benchmarks/README.md, “{html.escape(heading)}”: '
           "cold page cache, CPU</text>"]
    y = title_h
    for row in rows:
        label_y = y + len(series) * (bar + gap) / 2
        svg.append(f'<text x="{left - 12}" y="{label_y:.0f}" text-anchor="end" '
                   f'font-weight="600" fill="#212121">TP={html.escape(row["TP"])}</text>')
        if row.get("rank reads"):
            svg.append(f'<text x="{left - 12}" y="{label_y + 16:.0f}" text-anchor="end" '
                       f'font-size="11" fill="#616161">rank reads '
                       f'{html.escape(row["rank reads"])}</text>')
        for key, _, color in series:
            value = _seconds(row[key])
            length = max(value * scale, 1)
            svg.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar}" '
                       f'rx="2" fill="{color}"/>')
            svg.append(f'<text x="{left + length + 6:.1f}" y="{y + bar - 3}" font-size="11" '
                       f'fill="#424242">{value:.3f} s</text>')
            y += bar + gap
        y += group_gap
    svg.append(f'<line x1="{left}" y1="{title_h - 6}" x2="{left}" y2="{y - group_gap + 4}" '
               'stroke="#bdbdbd"/>')
    y += 4
    for i, (_, label, color) in enumerate(series):
        x = 20 + (i % 2) * 360
        row_y = y + (i // 2) * 26
        svg.append(f'<rect x="{x}" y="{row_y}" width="14" height="14" rx="2" fill="{color}"/>')
        svg.append(f'<text x="{x + 22}" y="{row_y + 12}" fill="#212121">'
                   f"{html.escape(label)}</text>")
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


# --- the architectures table ---------------------------------------------------------------


def _test_module(name: str) -> Any:
    """``tests/helpers/NAME.py``, imported by path (the tests' helpers are no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, repo_file(f"tests/helpers/{name}.py"))
    if spec is None or spec.loader is None:
        raise PluginError(f"docs: tests/helpers/{name}.py cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def architectures_table() -> str:
    """One row per architecture of ``tests/helpers/architectures.py``: the plan ``convert`` resolves
    with no ``--plan`` (asked of the code, not written here), what the tests convert and serve."""
    from shardspec.convert.tp_plan import resolve_plan

    module = _test_module("architectures")
    rows = ["| `model_type` | plan with no `--plan` | converted and merged back | "
            "served in vLLM | notes |", "|---|---|---|---|---|"]
    for arch in module.ARCHITECTURES:
        source = resolve_plan({"model_type": arch.model_type}, None).source
        plan = source.split(":")[0].replace(" and the common extras", "")
        layouts = "TP 2, TP 4, TP 2 × PP 2" + (", TP 2 × EP 2" if arch.experts else "")
        served = "TP 1, TP 2" if arch.served else ""
        rows.append(f"| `{arch.model_type}` | {plan} | {layouts} | {served} | "
                    f"{_cell(arch.note)} |")
    return "\n".join(rows)


def quantization_table() -> str:
    """One row per layout of ``tests/helpers/quantized_models.py``, as
    ``tests/integrations/vllm/test_vllm_quantized.py``
    converts and loads it."""
    module = _test_module("quantized_models")
    rows = ["| layout | `quant_method` (format) | each linear layer holds | converted and merged "
            "back | in vLLM at TP 1 and 2, from TP 1 and TP 2 checkpoints |",
            "|---|---|---|---|---|"]
    for name, layout in module.LAYOUTS.items():
        method = layout.config["quant_method"]
        if "format" in layout.config:
            method += f" (`{layout.config['format']}`)"
        vllm = {"served": "served: tokens and logprobs equal `auto`'s",
                "loaded": "loaded: every worker's bytes equal `auto`'s (vLLM's CPU kernel for "
                          "it needs AVX-512)",
                "": "not here: vLLM's CPU kernel for it needs AMX"}[layout.in_vllm]
        rows.append(f"| `{name}` | {method} | {layout.tensors} | TP 1, 2, 4, TP 2 × PP 2 | "
                    f"{vllm} |")
    return "\n".join(rows)
