"""Invalid vectors, manifest rules: the commit marker, the JSON dialect, the schema, versions
and extensions, the layout, paths and files, pieces, sizes, coverage, replicas, aliases and tied
tensors (SPEC 2-8). Each is an edit of a valid base that breaks one rule."""

from __future__ import annotations

import copy
import json
from typing import Any

import torch

from shardspec import Layout, Logical, Quantization, Shard, Tie

from .bases import (
    AWQ_O,
    AWQ_Q,
    DOWN,
    EMBED,
    F0,
    F1,
    FP8_DOWN,
    FP8_GATE,
    FP8_Q,
    GATE_UP,
    GPTQ_CONFIG,
    GPTQ_UP,
    MX,
    NORM,
    O_PROJ,
    SCALAR,
    SINKS,
    base_awq,
    base_fp8_blocks,
    base_fp8_channel,
    base_gptq,
    base_pp2_tp2,
    base_tp1,
    base_tp2,
    cut,
    gptq_layer,
    nested,
    saved_cuts,
    several_gate_up,
    tie_after,
)
from .checkpoints import Vector, Vectors, edit, handmade, saved, saved_whole, with_raw
from .raw import Pairs, Raw, manifest_text, random_bytes, raw, st_entries, st_file, values


def invalid_manifest_vectors() -> list[Vector]:
    out = Vectors()
    add = out.add
    tp1, tp2, pp = base_tp1(), base_tp2(), base_pp2_tp2()

    # 2.3 commit marker
    ck = tp1.clone()
    ck.manifest = None
    add("not-committed", "no-manifest", "A crash before the commit: the data files are complete "
        "but shardspec.json was never written. Readers MUST NOT look at the data files.", ck,
        [0])
    ck = tp1.clone()
    ck.files[".shardspec.json.shardspec-tmp"] = manifest_text(ck.m)
    ck.manifest = None
    add("not-committed", "temp-manifest", "A crash between writing the manifest under its "
        "temporary name and renaming it: only .shardspec.json.shardspec-tmp exists. Readers "
        "MUST NOT read the temporary file.", ck, [0])
    add("file-not-regular", "manifest-directory", "shardspec.json is a directory (SPEC 2.3 rule "
        "3: the error of 2.2 rule 7), as left by a tool that extracted an archive wrongly.",
        edit(tp1, lambda c: (c.files.update({"shardspec.json/.keep": b""}),
                             setattr(c, "manifest", None))), [0], section="2.3")
    add("file-not-regular", "manifest-fifo", "shardspec.json is a FIFO (created at run time): a "
        "reader that opens it without O_NONBLOCK after checking hangs.", tp1.clone(), [0],
        section="2.3", materialize="fifo", materialize_path="shardspec.json")
    add("path-escapes", "manifest-symlink", "shardspec.json is a symbolic link to a manifest "
        "outside the checkpoint directory (created at run time).", tp1.clone(), [0],
        section="2.3", materialize="symlink-outside", materialize_path="shardspec.json")

    # 3.2 encoding and syntax
    add("json-encoding", "bom", "The manifest starts with a UTF-8 byte order mark, as written "
        "by Windows editors and PowerShell's Out-File.", with_raw(tp1, lambda t: b"\xef\xbb\xbf"
                                                                    + t))
    ck = tp1.clone()
    ck.m["metadata"] = {"note": "caf\u00e9"}
    ck.raw = manifest_text(ck.m).replace("é".encode(), b"\xe9")
    add("json-encoding", "latin1-byte", "A metadata value written by a Latin-1 encoder: the "
        "byte 0xE9 is not valid UTF-8.", ck)
    ck = tp1.clone()
    ck.m["metadata"] = {"note": Raw('"truncated \\ud83d"')}
    ck.raw = manifest_text(ck.m)
    add("json-encoding", "lone-surrogate", "A string holding an escaped lone surrogate "
        "(\\ud83d, half of an emoji cut by a UTF-16 truncation): not a Unicode string.", ck)
    add("json-syntax", "trailing-comma", "A trailing comma after the last member, accepted by "
        "JSON5 and JavaScript but not by RFC 8259.",
        with_raw(tp1, lambda t: t.rstrip()[:-1].rstrip() + b",\n}\n"))
    add("json-syntax", "comment", "A /* comment */ after the opening brace (JSONC).",
        with_raw(tp1, lambda t: b"{ /* written by hand */" + t[1:]))
    add("json-syntax", "two-values", "The manifest written twice into one file (appended "
        "instead of replaced): a second JSON value follows the first.",
        with_raw(tp1, lambda t: t + t))
    add("json-syntax", "python-repr", "The manifest written with Python's str(dict) instead of "
        "json.dumps: single quotes.", with_raw(tp1, lambda t: repr(json.loads(t)).encode()))

    # 3.3 I-JSON
    ck = tp2.clone()
    tensors = Pairs(list(ck.m["tensors"].items()))
    tensors.append((NORM, {"alias_of": EMBED}))
    ck.m["tensors"] = tensors
    add("json-duplicate-name", "tensor", "The tensor model.norm.weight recorded twice, the "
        "second time as an alias: last-wins and first-wins parsers would load different data.",
        ck)
    ck = tp1.clone()
    ck.m["metadata"] = Pairs([("source", "run-1"), ("source", "run-2")])
    add("json-duplicate-name", "metadata", "A duplicate name inside metadata: the rule holds at "
        "every depth, even in informative members.", ck)
    ck = tp2.clone()
    piece = ck.piece(NORM, 0)
    ck.tensor(NORM)["pieces"][0] = Pairs([("rank", 0), *piece.items()])
    add("json-duplicate-name", "piece-rank", "A piece that names its rank twice.", ck)
    for variant, token in (("nan", "NaN"), ("infinity", "-Infinity"), ("1e400", "1e400")):
        ck = tp1.clone()
        ck.m["extensions"] = {"org.example.stats": {"must_understand": False, "loss": Raw(token)}}
        add("json-nonfinite", variant, f"An optional extension records a training loss as "
            f"{token}, as Python's json.dumps writes by default (allow_nan=True)"
            + (": 1e400 overflows binary64." if token == "1e400" else "."), ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.stats": {"must_understand": False,
                                                "tokens": Raw("1" + "0" * 400)}}
    add("json-nonfinite", "huge-integer", "An optional extension records a count as an "
        "integer token of 401 digits: a number too large for an IEEE 754 binary64 (SPEC 3.3 "
        "rule 2), like 1e400, though it has no fraction or exponent.", ck)
    ck = tp1.clone()
    ck.m["quantization"] = {"method": "none", "config": nested(63)}
    add("json-too-deep", "depth-65", "quantization.config nested one level past the limit: the "
        "deepest object is at depth 65 (compare valid-json-depth-64).", ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.deep": {"must_understand": False,
                                               "x": Raw("[" * 5000 + "]" * 5000)}}
    add("json-too-deep", "arrays-5000", "5000 nested arrays in an extension record: a parser "
        "that recurses without a bound can overflow its stack.", ck)
    add("json-too-large", "space-padded", "A valid manifest padded with spaces to "
        "MAX_MANIFEST_BYTES + 1 (268435457) bytes at run time; readers compare the size before "
        "parsing.", tp1.clone(), materialize="huge-manifest", materialize_path="shardspec.json")

    # 3.5 schema
    add("schema", "wrong-magic", "format is 'safetensors' instead of the magic 'shardspec'.",
        edit(tp1, lambda c: c.m.update(format="safetensors")), section="3.1")
    add("schema", "missing-quantization", "No quantization record, as in vLLM's sharded_state "
        "format, which records no quantization at all.",
        edit(tp1, lambda c: c.m.pop("quantization")), section="3.1")
    ck = tp1.clone()
    ck.raw = manifest_text([ck.m])
    add("schema", "not-an-object", "The manifest is a JSON array holding the manifest object.",
        ck, section="3.2")
    ck = tp1.clone()
    ck.m["layout"]["tp_size"] = Raw("1.0")
    add("schema", "integer-as-float", "layout.tp_size written as 1.0, as a JavaScript or YAML "
        "round trip may write it: integers must be integer tokens.", ck, section="3.3")
    ck = tp1.clone()
    ck.piece(NORM, 0)["shape"] = [Raw("4e0")]
    add("schema", "integer-exponent", "A piece shape written as [4e0].", ck, section="3.3")
    add("schema", "format-version-malformed", "format_version '1.0.0' does not match "
        "MAJOR.MINOR.", edit(tp1, lambda c: c.m.update(format_version="1.0.0")), section="4.1")
    add("schema", "format-version-trailing-newline", "format_version '1.0\\n': the schema's "
        "patterns are ECMA-262 regular expressions, whose $ matches only at the end of the "
        "string, not before a final newline as in Python's re (SPEC 3.5).",
        edit(tp1, lambda c: c.m.update(format_version="1.0\n")), section="4.1")
    ck = tp1.clone()
    ck.piece(NORM, 0)["dtype"] = "F32"
    add("schema", "unknown-field-same-version", "A piece with a member 1.2 does not define "
        "('dtype') in a 1.2 manifest: unknown fields are errors in the reader's own version "
        "(compare valid-newer-minor-version).", ck, section="4.3")
    ck = tp1.clone()
    ck.rename_file(F0, "../" + F0)
    ck.files[F0] = ck.files.pop("../" + F0)
    add("schema", "path-dotdot", "A data file path starting with '../' (a path-traversal "
        "attempt; the file sits inside the checkpoint).", ck, section="2.2")
    ck = tp1.clone()
    ck.rename_file(F0, "/tmp/" + F0)
    ck.files[F0] = ck.files.pop("/tmp/" + F0)
    add("schema", "path-absolute", "An absolute data file path.", ck, section="2.2")
    ck = tp1.clone()
    ck.tensor(NORM)["dtype"] = "FP32"
    add("schema", "unknown-dtype", "A manifest dtype 'FP32' that SPEC 6.4 does not define.", ck,
        section="6.4")
    ck = tp1.clone()
    ck.m["tensors"] = {"__metadata__": ck.tensor(NORM), DOWN: ck.tensor(DOWN)}
    add("schema", "tensor-named-metadata", "A tensor named __metadata__, the name safetensors "
        "reserves for its metadata.", ck, section="7.1")
    long_name = "é" * 600
    ck = tp1.clone()
    ck.m["tensors"] = {long_name: ck.tensor(NORM), DOWN: ck.tensor(DOWN)}
    ck.edit_file(F0, lambda es: [e.__setitem__(0, long_name) for e in es if e[0] == NORM])
    add("schema", "name-over-1024-bytes", "A tensor name of 600 characters (within the "
        "schema's 1024) but 1200 UTF-8 bytes, over MAX_NAME_BYTES; the data file holds it under "
        "the same name.", ck, section="7.1")

    # 4.2 version, 4.4 extensions
    ck = tp1.clone()
    ck.m["format_version"] = "2.0"
    ck.m["tensor_groups"] = [{"name": "all"}]
    add("version-major", "2.0", "A checkpoint 'from the future' (format 2.0, with a member 1.2 "
        "does not know): a 1.x reader must refuse it with version-major, not load it.", ck)
    add("version-major", "0.9", "A pre-release format 0.9 manifest.",
        edit(tp1, lambda c: c.m.update(format_version="0.9")))
    ck = tp1.clone()
    ck.raw = manifest_text({"format": "shardspec", "format_version": "2.0",
                            "shards": [{"file": F0}]})
    add("version-major", "2.0-restructured", "A 2.0 manifest with a different structure (no "
        "layout, ranks or tensors): version-major is decided before the schema check, so it is "
        "not error schema.", ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.encryption": {"must_understand": True,
                                                     "cipher": "aes-256-gcm"}}
    add("extension-unsupported", "must-understand", "The data files are encrypted by an "
        "extension with must_understand true that the reader does not know.", ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.hints": {"must_understand": False},
                          "org.example.int4-packing": {"must_understand": True}}
    add("extension-unsupported", "with-optional", "An optional and a must-understand "
        "extension: the first only warns (extension-ignored), the second is an error.", ck)

    # 5 layout
    ck = tp2.clone()
    ck.m["layout"]["world_size"] = 4
    add("layout-world-size", "product", "world_size 4 with tp_size 2, pp_size 1, ep_size 1 "
        "(and two rank records).", ck)
    ck = tp1.clone()
    ck.m["layout"].update(tp_size=2, world_size=2)
    add("layout-world-size", "rank-count", "tp_size 2 and world_size 2 but one rank record: "
        "rank 1's record was lost when the workers' records were gathered.", ck)
    ck = pp.clone()
    ck.m["layout"]["world_size"] = 2
    add("layout-world-size", "tp-only", "A PP=2 x TP=2 checkpoint whose world_size was "
        "recorded as the TP size (vLLM's rank is the TP rank only).", ck)
    add("layout-rank-order", "wrong-order", "PP=2 x TP=2 with coordinates numbered pp-ep-tp but "
        "rank_order recorded as tp-ep-pp (Megatron and vLLM number ranks differently): ranks 1 "
        "and 2 contradict it.", edit(pp, lambda c: c.m["layout"].update(rank_order="tp-ep-pp")))
    add("layout-rank-order", "duplicate-coordinates", "Both TP ranks claim tp_rank 0 (a "
        "copy-paste of rank 0's record).", edit(tp2, lambda c: c.m["ranks"][1].update(tp_rank=0)))
    add("layout-rank-order", "coordinate-out-of-range", "Rank 1 claims tp_rank 2 with tp_size "
        "2.", edit(tp2, lambda c: c.m["ranks"][1].update(tp_rank=2)))
    add("layout-ranks", "reversed", "The rank records listed in reverse order (rank 1 first).",
        edit(tp2, lambda c: c.m["ranks"].reverse()))
    ck = pp.clone()
    ck.m["ranks"][2], ck.m["ranks"][3] = ck.m["ranks"][3], ck.m["ranks"][2]
    add("layout-ranks", "swapped", "PP=2 x TP=2 with the records of ranks 2 and 3 swapped, as "
        "gathered in arrival order instead of rank order.", ck)

    # 2.1, 2.2 paths and files
    ck = tp1.clone()
    ck.m["ranks"][0]["files"].append(copy.deepcopy(ck.record(F0)))
    add("file-duplicate", "same-rank", "Rank 0 lists its only data file twice, as part 0 and "
        "part 1.", ck)
    ck = tp1.clone()
    ck.m["extra_files"] = [copy.deepcopy(ck.record(F0))]
    add("file-duplicate", "extra-file", "A data file listed again in extra_files, as when a "
        "script globs every file of the directory into the extra files.", ck)
    ck = tp1.clone()
    ck.rename_file(F0, f"shardspec.json/{F0}")
    ck.files[F0] = ck.files.pop(f"shardspec.json/{F0}")  # no directory holds it there
    add("path-unsafe", "under-manifest", "The data file is listed under shardspec.json, as if "
        "the manifest were a folder (SPEC 2.1 rule 6): object storage holds both keys, a "
        "directory cannot. The file lies at the top of the directory, unlisted, so no file is "
        "where the manifest says (file-missing too).", ck, section="2.1",
        validator_also=["file-missing"])
    path = "/".join(["é" * 120] * 5) + "/" + F0
    ck = tp1.clone()
    ck.rename_file(F0, path)
    add("path-unsafe", "utf8-bytes-2", f"A data file path of {len(path)} characters (within the "
        f"schema's 1024) but {len(path.encode())} UTF-8 bytes, over MAX_PATH_BYTES. The file "
        "exists there.", ck, section="2.2")
    path = "/".join(["😀" * 60] * 5) + "/config.json"
    ck = tp2.clone()
    ck.rename_file("config.json", path)
    ck.raw = manifest_text(ck.m, ascii_only=True)
    units = sum(1 + (ord(c) > 0xFFFF) for c in path)
    add("path-unsafe", "utf8-bytes-4", f"An extra file path of {len(path)} code points, written "
        f"as escaped surrogate pairs ({units} UTF-16 units), but {len(path.encode())} UTF-8 "
        "bytes, over MAX_PATH_BYTES.", ck, section="2.2")
    add("path-escapes", "symlink-file", "Rank 0's data file is a symbolic link to a file "
        "outside the checkpoint (created at run time), as when shards are linked from a shared "
        "cache.", tp1.clone(), [0], materialize="symlink-outside", materialize_path=F0)
    add("path-escapes", "dangling-symlink-outside", "Rank 0's data file is a symbolic link to "
        "a path outside the checkpoint where nothing exists (created at run time): the "
        "resolved location is outside, so path-escapes (SPEC 2.2 rule 5) comes before "
        "file-missing (rule 6).", tp1.clone(), [0], materialize="symlink-dangling-outside",
        materialize_path=F0)
    ck = tp1.clone()
    ck.rename_file(F0, "weights/" + F0)
    add("path-escapes", "symlink-dir", "The directory 'weights' holding the data file is a "
        "symbolic link to a directory outside the checkpoint (created at run time).", ck, [0],
        materialize="symlink-dir-escape", materialize_path="weights")
    add("file-missing", "rank-1", "Rank 1's data file is missing (an interrupted copy); rank "
        "0 can still load.", edit(tp2, lambda c: c.files.pop(F1)), [1])
    ck = saved({r: {f"w.{i}": values((4,), seed=200 + 10 * r + i) for i in range(3)}
                for r in range(2)}, Layout(tp_size=2), max_file_size=16)
    ck.files.pop("model-rank-1-part-1.safetensors")
    add("file-missing", "second-part", "Rank 1's part 1 of 3 is missing.", ck, [1])
    add("file-missing", "extra-file", "config.json, listed in extra_files, is missing. Only a "
        "validator reports it: readers do not open extra files (ranks is empty).",
        edit(tp2, lambda c: c.files.pop("config.json")), [])
    add("file-missing", "dangling-symlink", "Rank 0's data file is a dangling symbolic link "
        "(created at run time).", tp1.clone(), [0], materialize="symlink-dangling",
        materialize_path=F0)
    add("file-missing", "symlink-loop", "Rank 0's data file is a symbolic link to a link that "
        "points back to it (created at run time): nothing can be reached there, so "
        "file-missing (SPEC 2.2 rule 6), and a reader must not fail otherwise.", tp1.clone(),
        [0], materialize="symlink-loop", materialize_path=F0)
    add("file-missing", "manifest-dangling-symlink", "shardspec.json is a dangling symbolic "
        "link (created at run time): the name is there, so this is no uncommitted directory "
        "(not-committed) but a manifest that reaches nothing (SPEC 2.3 rule 3, 2.2 rule 6).",
        tp1.clone(), materialize="symlink-dangling", materialize_path="shardspec.json")
    add("file-not-regular", "fifo", "Rank 0's data file is a FIFO (created at run time): a "
        "reader that opens it blocking hangs forever.", tp1.clone(), [0], materialize="fifo",
        materialize_path=F0)
    ck = tp1.clone()
    ck.files[F0 + "/.keep"] = ck.files.pop(F0)
    add("file-not-regular", "directory", "Rank 0's data file is a directory.", ck, [0])

    # 6.1, 7.2 pieces
    ck = tp2.clone()
    ck.piece(NORM, 1)["file"] = F0
    ck.edit_file(F1, lambda es: es.remove(next(e for e in es if e[0] == NORM)))
    add("file-rank", "other-ranks-file", "Rank 1's replica of the norm weight names rank 0's "
        "file (as if ranks shared a file); rank 1's own file does not hold it.", ck)
    ck = tp1.clone()
    ck.piece(NORM, 0)["file"] = "model-rank-0-part-1.safetensors"
    norm_entry = next(e for e in st_entries(ck.files[F0]) if e[0] == NORM)
    ck.edit_file(F0, lambda es: es.remove(next(e for e in es if e[0] == NORM)))
    ck.files["model-rank-0-part-1.safetensors"] = st_file([norm_entry])
    add("file-rank", "unlisted-file", "A piece names model-rank-0-part-1.safetensors, which "
        "exists in the directory (vLLM's glob would find it) but no rank record lists.", ck)
    ck = tp2.clone()
    ck.tensor(NORM)["pieces"].append({"rank": 2, "file": F1, "offset": [0], "shape": [4],
                                      "replica": 2})
    add("piece-rank", "beyond-world-size", "A replica on rank 2 in a world of 2 ranks, left by "
        "a writer that was configured for TP=4.", ck)
    ck = tp1.clone()
    ck.tensor(NORM)["pieces"].append({"rank": 65535, "file": F0, "offset": [0], "shape": [4],
                                      "replica": 1})
    add("piece-rank", "max-rank", "A replica on rank 65535 (the schema's maximum) in a world of "
        "1.", ck)
    add("piece-bounds", "replica-offset", "Rank 1's replica of the [4] norm weight has offset "
        "[1] with shape [4]: it runs one element past the end.",
        edit(tp2, lambda c: c.piece(NORM, 1).update(offset=[1])))
    ck = tp2.clone()
    ck.piece(NORM, 1).update(offset=[0, 0], shape=[1, 4])
    ck.edit_file(F1, lambda es: [e.__setitem__(2, (1, 4)) for e in es if e[0] == NORM])
    add("piece-bounds", "extra-dimension", "Rank 1's replica of the [4] norm weight is stored "
        "unsqueezed as [1, 4]: a piece has as many dimensions as its tensor.", ck)
    add("piece-bounds", "zero-size", "The zero-size sinks tensor has global shape [0, 4] while "
        "its pieces are [0]: bounds hold for zero-size tensors too.",
        edit(tp2, lambda c: c.tensor(SINKS).update(shape=[0, 4])))
    ck = tp2.clone()
    ck.tensor(NORM)["pieces"].append({"rank": 0, "file": F0, "offset": [0], "shape": [4],
                                      "replica": 2})
    add("piece-duplicate", "replica-same-rank", "Rank 0 holds the norm weight as replica 0 and "
        "again as replica 2.", ck)
    ck = tp2.clone()
    ck.tensor(EMBED)["pieces"].append({"rank": 1, "file": F1, "offset": [0, 0], "shape": [4, 4],
                                       "replica": 1})
    add("piece-duplicate", "two-slices", "Rank 1 holds its half of the embedding and also a "
        "replica of rank 0's half, both in its one file: a file holds one entry of a name, so "
        "the two pieces cannot be told apart.", ck)
    gate_up = several_gate_up()
    ck = gate_up.clone()
    pieces = ck.m["tensors"][GATE_UP]["pieces"]
    second, pieces[1]["file"] = pieces[1]["file"], pieces[0]["file"]
    ck.m["ranks"][0]["files"] = [f for f in ck.m["ranks"][0]["files"] if f["path"] != second]
    del ck.files[second]
    add("piece-duplicate", "several-in-one-file", "Format 1.3: rank 0's two pieces of the fused "
        "gate_up_proj both name its first file, which holds one entry of that name.", ck)
    four = values((4, 4), torch.float32, 170)
    corners = {0: [(0, 0), (2, 2)], 1: [(0, 2), (2, 0)]}
    files = {f"r{r}-{k}.safetensors": (r, [(GATE_UP, "F32", (2, 2), raw(
        four[a:a + 2, b:b + 2].contiguous()))]) for r, boxes in corners.items()
        for k, (a, b) in enumerate(boxes)}
    ck = handmade(Layout(tp_size=2), files, {GATE_UP: {"dtype": "F32", "shape": [4, 4], "pieces": [
        {"rank": r, "file": f"r{r}-{k}.safetensors", "offset": [a, b], "shape": [2, 2]}
        for r, boxes in corners.items() for k, (a, b) in enumerate(boxes)]}})
    ck.m["format_version"] = "1.3"
    add("piece-duplicate", "not-joinable-two-dimensions", "Format 1.3: each rank holds two "
        "opposite 2 x 2 corners of an F32 [4, 4], in two files. The pieces cover the tensor "
        "once, but their offsets differ in both dimensions: they have no join (7.2 rule 7).",
        ck)
    half = {f"r{r}-{k}.safetensors": (r, [("w", "F4", (2, 1), random_bytes(1, 171 + 2 * r + k))])
            for r in range(2) for k in range(2)}
    ck = handmade(Layout(tp_size=2), half, {"w": {"dtype": "F4", "shape": [2, 4], "pieces": [
        {"rank": r, "file": f"r{r}-{k}.safetensors", "offset": [0, r + 2 * k], "shape": [2, 1]}
        for r in range(2) for k in range(2)]}})
    ck.m["format_version"] = "1.3"
    add("piece-duplicate", "sub-byte-half-byte-runs", "Format 1.3: F4 [2, 4] where each rank "
        "holds two one-column pieces (columns r and r + 2). Each piece is one whole byte, but "
        "its run of a row is one 4-bit element: the join would split bytes, and pieces of a "
        "sub-byte dtype join only in runs of whole bytes (7.2 rule 7).", ck)
    weights = values((4, 4), torch.float32, 172)
    scales = values((4, 1), torch.float32, 173)
    tied = {f"r{r}-{k}.safetensors": (r, [
        ("w", "F32", (1, 4), raw(weights[r + 2 * k:r + 2 * k + 1])),
        ("w_scale", "F32", (1, 1), raw(scales[r + 2 * k:r + 2 * k + 1]))])
        for r in range(2) for k in range(2)}
    records: dict[str, Any] = {name: {"dtype": "F32", "shape": [4, width], "pieces": [
        {"rank": r, "file": f"r{r}-{k}.safetensors", "offset": [r + 2 * k, 0],
         "shape": [1, width]} for r in range(2) for k in range(2)]}
        for name, width in (("w", 4), ("w_scale", 1))}
    records["w_scale"]["tied_to"] = {"tensor": "w", "block": [1], "axes": [0]}
    ck = handmade(Layout(tp_size=2), tied, records)
    ck.m["format_version"] = "1.3"
    add("piece-duplicate", "tied-and-base-several", "Format 1.3: a weight cut in two parts "
        "per rank (rows r and r + 2) and its per-row scale tied to it, cut alike. The pieces "
        "would join, but a tied tensor and its base keep one piece per rank (7.2 rule 3, 8.4 "
        "rule 1).", ck)
    ck = gate_up.clone()
    for piece in ck.m["tensors"][GATE_UP]["pieces"]:
        del piece["offset"]
    ck.m["tensors"][GATE_UP]["rank_local"] = True
    del ck.m["tensors"][GATE_UP]["shape"]
    add("piece-duplicate", "rank-local-in-two-files", "Format 1.3: the fused gate_up_proj "
        "recorded rank-local, with two pieces per rank in two files: a rank-local tensor has "
        "one piece per rank (7.5).", ck)

    # 7.1 sizes
    big = 2**32
    ck = tp1.clone()
    ck.m["tensors"]["huge"] = {"dtype": "F32", "shape": [big, big], "pieces": [
        {"rank": 0, "file": F0, "offset": [0, 0], "shape": [0, big]}]}
    ck.edit_file(F0, lambda es: es.append(["huge", "F32", (0, big), b""]))
    add("shape-overflow", "global-2-pow-64", "A global tensor of shape [2^32, 2^32] (2^64 "
        "elements) whose only piece is empty: the element count wraps to 0 in 64-bit "
        "arithmetic.", ck)
    ck = tp1.clone()
    ck.m["tensors"]["huge"] = {"dtype": "I8", "shape": [2**62, 2], "pieces": [
        {"rank": 0, "file": F0, "offset": [0, 0], "shape": [0, 2]}]}
    ck.edit_file(F0, lambda es: es.append(["huge", "I8", (0, 2), b""]))
    add("shape-overflow", "exactly-2-pow-63", "A global shape [2^62, 2]: 2^63 elements, one past "
        "MAX_SIZE.", ck)
    ck = tp1.clone()
    ck.tensor(NORM)["logical"] = {"dtype": "BF16", "shape": [2**62, 4]}
    add("shape-overflow", "logical", "A logical shape of 2^64 elements.", ck, section="7.1")

    # 7.3 coverage, 7.4 replicas, 7.6 aliases
    ck = tp2.clone()
    ck.tensor(EMBED)["pieces"].pop(1)
    ck.edit_file(F1, lambda es: es.remove(next(e for e in es if e[0] == EMBED)))
    add("coverage-gap", "missing-shard", "The embedding's rank-1 half is neither recorded nor "
        "stored (lost in the gather): rows 4..8 are never written.", ck)
    add("coverage-gap", "short-split", "The embedding's global shape is [9, 4] but its pieces "
        "cover 8 rows (the vocabulary padding was recorded, not written).",
        edit(tp2, lambda c: c.tensor(EMBED).update(shape=[9, 4])))
    add("coverage-overlap", "replicas-unnumbered", "Both ranks' copies of the replicated norm "
        "are replica 0: Megatron-style replica ids were not recorded.",
        edit(tp2, lambda c: c.piece(NORM, 1).pop("replica")))
    add("coverage-overlap", "partial", "Rank 1's rowwise o_proj piece starts at column 3 "
        "instead of 4: column 3 is covered twice and column 7 not at all.",
        edit(tp2, lambda c: c.piece(O_PROJ, 1).update(offset=[0, 3])))
    add("coverage-overlap", "scalar", "A replicated scalar whose two copies are both replica 0: "
        "any two pieces of a scalar overlap.",
        edit(tp2, lambda c: c.piece(SCALAR, 1).pop("replica")))
    ck = tp2.clone()
    ck.piece(NORM, 1)["shape"] = [2]
    ck.edit_file(F1, lambda es: [e.__setitem__(slice(2, 4), [(2,), e[3][:8]])
                                 for e in es if e[0] == NORM])
    add("replica-mismatch", "shape", "Rank 1's replica of the [4] norm weight holds only its "
        "first two elements.", ck)
    ck = tp2.clone()
    ck.piece(NORM, 1).update(offset=[2], shape=[2])
    ck.edit_file(F1, lambda es: [e.__setitem__(slice(2, 4), [(2,), e[3][8:]])
                                 for e in es if e[0] == NORM])
    add("replica-mismatch", "offset", "Rank 1's replica of the [4] norm weight is its second "
        "half (offset [2], shape [2]), which no replica-0 piece is.", ck)
    add("alias-target", "missing", "lm_head.weight is an alias of 'model.embed.weight', which "
        "does not exist (a typo for model.embed_tokens.weight).",
        edit(tp2, lambda c: c.tensor("lm_head.weight").update(alias_of="model.embed.weight")))
    add("alias-target", "chain", "output.weight is an alias of lm_head.weight, itself an alias: "
        "aliases do not chain.",
        edit(tp2, lambda c: c.m["tensors"].update({"output.weight": {
            "alias_of": "lm_head.weight"}})))
    add("alias-target", "self", "lm_head.weight is an alias of itself.",
        edit(tp2, lambda c: c.tensor("lm_head.weight").update(alias_of="lm_head.weight")))

    # 8.4 tied tensors
    fp8b, fp8c, awq, gptq = base_fp8_blocks(), base_fp8_channel(), base_awq(), base_gptq()
    GATE_S, Q_W, Q_S = FP8_GATE + "_scale_inv", f"{FP8_Q}.weight", f"{FP8_Q}.weight_scale"
    ck = tie_after(base_fp8_blocks((64, 192), tied=False), {
        GATE_S: Tie(tensor=FP8_GATE, block=(128, 128)),
        FP8_DOWN + "_scale_inv": Tie(tensor=FP8_DOWN, block=(128, 128))})
    add("tie-split", "scale-off-block", "The colwise FP8 gate_proj [256, 256] is split at row "
        "64, inside its first 128-row scale block, while its weight_scale_inv [2, 2] pieces sit "
        "at the rounded place (row 0 on rank 0, row 1 on rank 1): both ranks hold part of block "
        "0 and neither can dequantize it (vLLM refuses block-quantized layers whose per-rank "
        "size is not a multiple of the block).", ck)
    cuts, ties, logical = gptq_layer(GPTQ_UP, 1, (4, 12), 340, qzero_sizes=(1, 1))
    ck = tie_after(saved_cuts(cuts, Layout(tp_size=2), logical=logical,
                              quantization=Quantization(method="gptq", config=GPTQ_CONFIG)),
                   ties)
    add("tie-split", "mid-pack", "A GPTQ qweight I32 [4, 16] (logical [32, 16]) split along dim "
        "1 after 4 output features: its qzeros I32 [4, 2] (block [8, 8], 8 output features a "
        "word) would have to be split inside a word; its pieces are a word each.", ck)
    ck = fp8b.clone()
    ck.piece(GATE_S, 0)["offset"], ck.piece(GATE_S, 1)["offset"] = [1, 0], [0, 0]
    add("tie-split", "swapped-offsets", "The gate_proj weight_scale_inv pieces swapped between "
        "the ranks (rank 0 holds scale row 1, rank 1 row 0), as a gather in arrival order "
        "would record them: coverage holds, but each rank's scales belong to the other's "
        "rows.", ck)
    layout = Layout(tp_size=1, pp_size=2)
    weight = values((8, 4), torch.float8_e4m3fn, 370)
    scale = torch.tensor(0.25)
    name = "model.layers.0.mlp.down_proj"
    states = {0: {f"{name}.weight": weight, f"{name}.weight_scale": scale},
              1: {f"{name}.weight_scale": scale, "lm_head.weight": values((8, 4), seed=371)}}
    sharding = {0: {f"{name}.weight": Shard((8, 4), (0, 0)),
                    f"{name}.weight_scale": Shard((), ())},
                1: {f"{name}.weight_scale": Shard((), (), replica=1),
                    "lm_head.weight": Shard((8, 4), (0, 0))}}
    ck = tie_after(saved(states, layout, sharding=sharding,
                         quantization=Quantization(method="fp8")),
                   {f"{name}.weight_scale": Tie(tensor=f"{name}.weight")})
    add("tie-split", "rank-without-base", "PP=2: stage 0 holds layer 0's FP8 down_proj weight, "
        "but its per-tensor weight_scale (tied without block) is also held by stage 1, which "
        "has no piece of the weight (a writer that replicated every scalar on every rank).", ck)
    blocks = torch.tensor(list(random_bytes(4 * 16 * 2 * 16, 372)),
                          dtype=torch.uint8).reshape(4, 16, 2, 16)
    scales = torch.tensor(list(random_bytes(4 * 16 * 2, 373)), dtype=torch.uint8).reshape(4, 16, 2)
    ck = tie_after(saved_cuts({f"{MX}.gate_up_proj_blocks": cut(blocks, 3, (8, 8)),
                               f"{MX}.gate_up_proj_scales": cut(scales, None)},
                              Layout(tp_size=2), quantization=Quantization(method="mxfp4"),
                              logical={f"{MX}.gate_up_proj_blocks": Logical(
                                  dtype="BF16", shape=(4, 16, 64))}),
                   {f"{MX}.gate_up_proj_scales": Tie(tensor=f"{MX}.gate_up_proj_blocks",
                                                     block=(1, 1, 32))})
    add("tie-split", "inner-dimension", "MXFP4 gate_up_proj_blocks U8 [4, 16, 2, 16] (logical "
        "[4, 16, 64]) split across TP=2 along dim 3, the 16 bytes of one 32-value block: a "
        "base's inner dimensions are never split.", ck)
    add("tie-target", "missing", "q_proj.scales is tied to 'model.layers.0.self_attn.q_proj."
        "weight', the unquantized model's name, which this AWQ checkpoint does not have (its "
        "weight is q_proj.qweight).",
        edit(awq, lambda c: c.tensor(f"{AWQ_Q}.scales")["tied_to"].update(tensor=Q_W)))
    ck = fp8c.clone()
    ck.m["tensors"][f"{FP8_Q}.base_layer.weight"] = {"alias_of": Q_W}
    ck.tensor(Q_S)["tied_to"]["tensor"] = f"{FP8_Q}.base_layer.weight"
    add("tie-target", "alias", "q_proj.weight_scale is tied to q_proj.base_layer.weight (a "
        "PEFT-style name), an alias of q_proj.weight: a tie names the tensor with the data.", ck)
    add("tie-target", "tied", "q_proj.qzeros is tied to q_proj.scales, itself tied to "
        "q_proj.qweight: ties do not chain.",
        edit(awq, lambda c: c.tensor(f"{AWQ_Q}.qzeros")["tied_to"].update(
            tensor=f"{AWQ_Q}.scales")))
    add("tie-target", "self", "q_proj.scales is tied to itself.",
        edit(awq, lambda c: c.tensor(f"{AWQ_Q}.scales")["tied_to"].update(
            tensor=f"{AWQ_Q}.scales")))
    ck = fp8c.clone()
    record = ck.tensor(Q_W)
    record.update(rank_local=True, logical={"dtype": "BF16", "shape": [8, 8]})
    record.pop("shape")
    for piece in record["pieces"]:
        piece.pop("offset")
        piece.pop("replica", None)
    ck.m["tensors"][Q_W] = {k: record[k] for k in ("dtype", "rank_local", "pieces", "logical")}
    add("tie-target", "rank-local", "q_proj.weight is recorded rank-local, so its pieces are "
        "not slices of one grid, yet q_proj.weight_scale is tied to it: a base is a global "
        "tensor.", ck)
    weight = values((128, 192), torch.float8_e4m3fn, 380)
    ck = tie_after(saved_whole({"w.weight": weight, "w.weight_scale_inv": torch.ones(1, 1)},
                               quantization=Quantization(method="fp8"),
                               logical={"w.weight": Logical(dtype="BF16", shape=(128, 192))}),
                   {"w.weight_scale_inv": Tie(tensor="w.weight", block=(128, 128))})
    add("tie-shape", "floor-blocks", "An FP8 weight [128, 192] with 128 x 128 block scales "
        "F32 [1, 1]: the scale grid was computed with floor division, but the last 64 columns "
        "are a block of their own: ceil(192 / 128) = 2.", ck)
    name = "model.layers.0.mlp.gate_up_proj"
    ck = tie_after(saved_whole({f"{name}.weight": values((8, 4), torch.float8_e4m3fn, 381),
                                f"{name}.weight_scale": torch.tensor([0.25, 0.5])},
                               quantization=Quantization(method="fp8")),
                   {f"{name}.weight_scale": Tie(tensor=f"{name}.weight")})
    add("tie-shape", "per-tensor-two-values", "A merged gate_up_proj whose per-tensor "
        "weight_scale F32 [2] holds one value per merged projection, as vLLM keeps it, tied "
        "without block: without block a tie is one value for the whole base (this one is "
        "block [4] on axes [0]).", ck)
    add("tie-shape", "axes-out-of-range", "up_proj.g_idx is tied with block [1] on axes [2]: "
        "its base's grid [32, 16] has no dimension 2.",
        edit(gptq, lambda c: c.tensor(f"{GPTQ_UP}.g_idx")["tied_to"].update(axes=[2])))
    add("tie-shape", "axes-duplicated", "gate_proj's weight_scale_inv is tied with block "
        "[128, 128] on axes [0, 0]: the shape [2, 2] agrees, but an axis is named twice.",
        edit(fp8b, lambda c: c.tensor(GATE_S)["tied_to"].update(axes=[0, 0])))
    add("tie-shape", "pack-not-dividing", "o_proj's qweight I32 [64, 4] records the logical "
        "shape [64, 30]: 4 words do not divide 30 output features (a quantizer that padded the "
        "features to 32 recorded the unpadded count), so scales and qzeros have no grid.",
        edit(awq, lambda c: c.tensor(f"{AWQ_O}.qweight")["logical"].update(shape=[64, 30])))

    return out
