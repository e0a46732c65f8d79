"""Invalid vectors, data files: the safetensors container (SPEC 6.3), agreement between the
files and the manifest (7.2) and integrity (9). Each is an edit of a valid base that breaks one
rule; where a data file changes, its record is updated so only the intended finding fires."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from collections.abc import Callable

from shardspec import Layout

from .bases import CONFIG, DOWN, EMBED, F0, NORM, SCALAR, SINKS, base_fp8, base_tp1, base_tp2
from .checkpoints import Ckpt, Vector, Vectors, edit, handmade, with_header
from .raw import st_assemble, st_entries, st_header_text


def invalid_file_vectors() -> list[Vector]:
    out = Vectors()
    add = out.add
    tp1, tp2, fp8 = base_tp1(), base_tp2(), base_fp8()

    # 6.3 safetensors container (rank 0's file of tp1 unless said otherwise)
    def length_prefix(value: bytes) -> Callable[[Ckpt], object]:
        return lambda c: c.put(F0, value + c.files[F0][8:])

    n = len(tp1.files[F0])
    (hlen,) = struct.unpack("<Q", tp1.files[F0][:8])
    add("st-header-length", "over-limit", "The header length is 100000001, one past "
        "MAX_SAFETENSORS_HEADER_BYTES.",
        edit(tp1, length_prefix(struct.pack("<Q", 100_000_001))), [0])
    add("st-header-length", "big-endian", "The header length written big-endian: a reader that "
        "trusts it allocates petabytes.",
        edit(tp1, length_prefix(struct.pack(">Q", hlen))), [0])
    add("st-header-length", "past-eof", f"The header length is {n - 7}: one byte past the end of "
        f"the {n}-byte file.", edit(tp1, length_prefix(struct.pack("<Q", n - 7))), [0])
    add("st-header-length", "five-bytes", "A data file of 5 bytes, shorter than the 8-byte "
        "header length.", edit(tp1, lambda c: c.put(F0, c.files[F0][:5])), [0])
    add("st-header-length", "empty-file", "A zero-byte data file, as left by a failed download.",
        edit(tp1, lambda c: c.put(F0, b"")), [0])
    add("st-header-json", "leading-space", "The header starts with a space before '{' (the "
        "safetensors README, schema and code disagree on leading whitespace; SPEC 6.3 forbids "
        "it).", with_header(tp1, F0, lambda h: b" " + h), [0])
    add("st-header-json", "array", "The header is a JSON array of the entries.",
        with_header(tp1, F0, lambda h: b"[" + h + b"]"), [0])
    add("st-header-json", "trailing-garbage", "Bytes other than spaces after the header object.",
        with_header(tp1, F0, lambda h: h + b"\x00\x00garbage"), [0])
    add("st-header-json", "tab-padding", "The header padded with tabs instead of spaces.",
        with_header(tp1, F0, lambda h: h + b"\t\t\t\t"), [0])
    add("st-header-json", "invalid-utf8", "A __metadata__ value in Latin-1 ('caf\\xe9'): the "
        "header is not valid UTF-8.",
        with_header(tp1, F0, lambda h: h.replace(b'"pt"', b'"caf\xe9"')), [0])
    add("st-header-json", "nan", "A data offset written as NaN.",
        with_header(tp1, F0, lambda h: h.replace(b'"data_offsets":[0,', b'"data_offsets":[NaN,',
                                                 1)), [0])
    first = st_entries(tp1.files[F0])[0][0]
    def dup_tensor(h: bytes) -> bytes:
        entry = json.dumps({first: json.loads(h)[first]}, separators=(",", ":"))[1:-1]
        return h[:-1] + b"," + entry.encode() + b"}"
    add("st-duplicate-key", "tensor", "The header names the same tensor twice with the same "
        "entry: which one a reader uses depends on its JSON parser (a parser differential "
        "found in a safetensors security review).", with_header(tp1, F0, dup_tensor), [0])
    add("st-duplicate-key", "entry-member", "An entry with two 'dtype' members (F32 and F16).",
        with_header(tp1, F0, lambda h: h.replace(b'{"dtype":"F32",',
                                                 b'{"dtype":"F32","dtype":"F16",')), [0])
    add("st-duplicate-key", "metadata", "__metadata__ with 'format' twice.",
        with_header(tp1, F0, lambda h: h.replace(b'{"format":"pt"}',
                                                 b'{"format":"pt","format":"np"}')), [0])
    add("st-entry", "extra-member", "An entry with a member other than dtype, shape and "
        "data_offsets ('checksum').",
        with_header(tp1, F0, lambda h: h.replace(b'{"dtype":"F32",',
                                                 b'{"checksum":"00","dtype":"F32",')), [0])
    add("st-entry", "negative-dim", "An entry of shape [-4].",
        with_header(tp1, F0, lambda h: h.replace(b'"shape":[4]', b'"shape":[-4]')), [0])
    add("st-entry", "float-dim", "An entry of shape [4.0].",
        with_header(tp1, F0, lambda h: h.replace(b'"shape":[4]', b'"shape":[4.0]')), [0])
    def swap_offsets(h: bytes) -> bytes:
        header = json.loads(h)
        header[NORM]["data_offsets"].reverse()
        return st_header_text(header)
    add("st-entry", "begin-after-end", "An entry whose data_offsets are [end, begin].",
        with_header(tp1, F0, swap_offsets), [0])
    def drop_offsets(h: bytes) -> bytes:
        header = json.loads(h)
        del header[NORM]["data_offsets"]
        return st_header_text(header)
    add("st-entry", "missing-offsets", "An entry without data_offsets.",
        with_header(tp1, F0, drop_offsets), [0])
    for variant, metadata, what in (
            ("integer-value", b'{"format":"pt","total_size":80}', "an integer value "
             "(total_size copied from a Hugging Face index)"),
            ("string", b'"pt"', "a string instead of an object"),
            ("nested", b'{"format":"pt","config":{"dim":"4"}}', "a nested object")):
        add("st-metadata", variant, f"__metadata__ is {what}.",
            with_header(tp1, F0, lambda h, m=metadata: h.replace(b'{"format":"pt"}', m)), [0])

    def rebuild(entries: list[tuple[str, str, tuple[int, ...], bytes]],
                spans: list[tuple[int, int]], data: bytes) -> bytes:
        header = {"__metadata__": {"format": "pt"}}
        for (name, dtype, shape, _), span in zip(entries, spans, strict=True):
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": list(span)}
        return st_assemble(st_header_text(header), data)

    # the BF16 [4, 8] weight (64 bytes), then the F32 norm (16 bytes)
    entries = sorted(st_entries(tp1.files[F0]), key=lambda e: e[0] != DOWN)
    assert [(e[0], len(e[3])) for e in entries] == [(DOWN, 64), (NORM, 16)]
    data = entries[0][3] + entries[1][3]
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (64, 76)], data[:76]))
    add("st-size", "span-mismatch", "The F32 [4] norm spans 12 bytes instead of 16 (the data "
        "region was shortened to match, so offsets still tile it).", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild([entries[0], (NORM, "F32", (2**62, 4), b"")], [(0, 64), (64, 64)],
                       data[:64]))
    add("st-size", "overflow", "A header entry of shape [2^62, 4] in F32 spanning 0 bytes: the "
        "byte count overflows 64 bits (wrapping to 0 in unchecked arithmetic).", ck, [0])
    for dtype, count, bits in (("F4", 3, 4), ("F6_E2M3", 2, 6)):
        nbytes = (count * bits + 7) // 8
        ck = handmade(Layout(tp_size=1), {F0: (0, [("w", dtype, (count,), bytes(nbytes))])},
                      {"w": {"dtype": dtype, "shape": [count], "pieces": [
                          {"rank": 0, "file": F0, "offset": [0], "shape": [count]}]}})
        add("st-size", f"{dtype.lower()}-partial-byte", f"A {dtype} tensor of {count} elements: "
            f"{count * bits} bits are not whole bytes (in the manifest and in the file).", ck,
            section="6.5")
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (60, 76)], data[:76]))
    add("st-offsets", "overlap", "The norm's data starts 4 bytes inside the weight's.", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (68, 84)], data[:64] + bytes(4) + data[64:]))
    add("st-offsets", "hole", "4 unused bytes between the two tensors.", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (64, 80)], data + b"PK\x05\x06" + bytes(18)))
    add("st-offsets", "trailing-bytes", "An empty zip archive appended after the last tensor (a "
        "polyglot file).", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (64, 80)], data[:72]))
    add("st-offsets", "past-end", "The data region is 8 bytes shorter than the offsets say "
        "(the manifest's size was updated to the short file).", ck, [0])
    ck = tp1.clone()
    ck.m["tensors"]["model.norm.bias"] = copy.deepcopy(ck.tensor(NORM))
    ck.put(F0, rebuild([*entries, ("model.norm.bias", "F32", (4,), b"")],
                       [(0, 64), (64, 80), (64, 80)], data))
    add("st-offsets", "shared-storage", "Two tensors with the same data_offsets, as a writer "
        "that deduplicates tied weights inside the file would store them.", ck, [0])
    huge = 2**62
    files = {F0: (0, [("w.empty", "F32", (1, 4, 0), b""), ("w.one", "U8", (1,), b"\x07")])}
    tensors = {"w.empty": {"dtype": "F32", "shape": [huge, 4, 0], "pieces": [
                   {"rank": 0, "file": F0, "offset": [0, 0, 0], "shape": [1, 4, 0]}]},
               "w.one": {"dtype": "U8", "shape": [1], "pieces": [
                   {"rank": 0, "file": F0, "offset": [0], "shape": [1]}]}}
    add("shape-overflow", "partial-product", "A global tensor of shape [2^62, 4, 0] (its one "
        "piece [1, 4, 0]): no element, but "
        "the product taken in order passes MAX_SIZE at 2^62 x 4 (SPEC 7.1 rule 4): torch, "
        "sizing tensors in int64, cannot even hold it.",
        handmade(Layout(tp_size=1), files, tensors), [0], section="7.1")
    add("st-entry", "dtype-not-a-string", "An entry whose dtype is the number 32: not a string, "
        "so the entry is malformed (st-entry); only a string that names no dtype is st-dtype "
        "(SPEC 6.3 rule 5).",
        with_header(tp1, F0, lambda h: h.replace(b'"dtype":"F32"', b'"dtype":32   ')), [0])
    add("st-dtype", "lowercase", "The norm's dtype written 'f32'.",
        with_header(tp1, F0, lambda h: h.replace(b'"dtype":"F32"', b'"dtype":"f32"')), [0])
    add("st-dtype", "torch-name", "An FP8 weight's dtype written 'F8_E4M3FN' (torch's name) "
        "instead of F8_E4M3.", with_header(fp8, F0, lambda h: h.replace(
            b'"dtype":"F8_E4M3"', b'"dtype":"F8_E4M3FN"')), [0])

    # 7.2 agreement between files and manifest
    add("st-mismatch", "dtype", "The BF16 weight is stored as F16 (same size, other meaning).",
        with_header(tp1, F0, lambda h: h.replace(b'"dtype":"BF16"', b'"dtype":"F16"')), [0])
    add("st-mismatch", "shape-transposed", "The [4, 8] weight is stored as [8, 4] (a "
        "transposed rowwise/colwise mix-up).",
        with_header(tp1, F0, lambda h: h.replace(b'"shape":[4,8]', b'"shape":[8,4]')), [0])
    ck = tp2.clone()
    ck.edit_file(F0, lambda es: [e.__setitem__(2, (1,)) for e in es if e[0] == SCALAR])
    add("st-mismatch", "scalar-as-1d", "The scalar logit_scale is stored with shape [1] on rank "
        "0, as exporters that promote 0-d tensors write it.", ck, [0])
    ck = fp8.clone()
    scale = "model.layers.0.self_attn.q_proj.weight_scale"
    ck.edit_file(F0, lambda es: es.remove(next(e for e in es if e[0] == scale)))
    add("st-missing-tensor", "fp8-scale", "Rank 0's file lacks the FP8 weight_scale the manifest "
        "records (vLLM's sharded_state saver has lost scale tensors).", ck, [0])
    ck = tp2.clone()
    ck.edit_file(F0, lambda es: es.remove(next(e for e in es if e[0] == SINKS)))
    add("st-missing-tensor", "zero-size", "Rank 0's file lacks the zero-size sinks tensor the "
        "manifest records (vLLM drops zero-size tensors).", ck, [0])
    ck = tp1.clone()
    ck.edit_file(F0, lambda es: es.append(["model.rotary_emb.inv_freq", "F32", (2,),
                                           struct.pack("<2f", 1.0, 0.01)]))
    add("st-extra-tensor", "unrecorded-buffer", "The file holds a rotary inv_freq buffer the "
        "manifest does not record (an unexpected key is a bare KeyError in vLLM).", ck, [0])
    ck = tp2.clone()
    embed = next(e for e in st_entries(ck.files[F0]) if e[0] == EMBED)
    ck.edit_file(F0, lambda es: es.append(["lm_head.weight", *embed[1:]]))
    add("st-extra-tensor", "alias-entry", "Rank 0's file also stores the tied lm_head.weight, "
        "which the manifest records as an alias: an alias has no data of its own.", ck, [0])

    # 9 integrity
    add("file-size", "truncated", "Rank 0's data file lost its last 4 bytes (an interrupted "
        "download); the manifest's size is unchanged.",
        edit(tp1, lambda c: c.put(F0, c.files[F0][:-4], refresh=False)), [0])
    add("file-size", "appended", "16 bytes appended to rank 0's data file.",
        edit(tp1, lambda c: c.put(F0, c.files[F0] + bytes(16), refresh=False)), [0])
    add("file-size", "extra-file", "config.json has another size than its record. Only a "
        "validator reports it: readers do not open extra files (ranks is empty).",
        edit(tp2, lambda c: c.put("config.json", CONFIG + b"\n", refresh=False)), [])
    def flip(path: str, index: int) -> Callable[[Ckpt], object]:
        def change(c: Ckpt) -> None:
            data = bytearray(c.files[path])
            data[index] ^= 0x01
            c.put(path, bytes(data), refresh=False)
        return change
    add("checksum-mismatch", "bit-flip", "One bit flipped in the last byte of rank 0's data "
        "(silent corruption, same size): only checksum verification finds it.",
        edit(tp1, flip(F0, n - 1)), [0], verify=True)
    index = tp1.files[F0].index(b'"pt"') + 2
    add("checksum-mismatch", "metadata-edit", "The __metadata__ value 'pt' changed to 'pu' "
        "after the manifest was written: the header is still valid.",
        edit(tp1, flip(F0, index)), [0], verify=True)
    def wrong_blake2b(c: Ckpt) -> None:
        c.record(F0)["checksums"]["blake2b"] = hashlib.blake2b(c.files[F0] + b"!").hexdigest()
    add("checksum-mismatch", "blake2b-only", "Rank 0's record lists its file's right sha256 "
        "and a wrong blake2b: every listed digest a reader knows is verified (9.2 rule 5), "
        "whether it copies, maps or reshards the file. blake2b is OPTIONAL to implement (rule "
        "3), so the vector requires it: it runs only for readers that declare it "
        "(--implements blake2b), as every reader of conformance/examples does.",
        edit(tp1, wrong_blake2b), [0], verify=True, requires=["blake2b"])
    add("checksum-mismatch", "extra-file", "config.json changed in place (same size). Only a "
        "validator reports it: readers do not open extra files (ranks is empty).",
        edit(tp2, flip("config.json", 2)), [], verify=True)
    return out
