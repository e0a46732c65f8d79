"""Broken manifests: one mutation builder a rule family (version, extensions, JSON dialect,
schema, layout, pieces, coverage, replicas, aliases, files, paths, the commit, shape overflow),
each registered with the error code and SPEC section a reader must refuse it under.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from ..format.limits import MANIFEST_NAME
from ..format.manifest import format_version
from .handwritten import file_records
from .mutations import (
    Context,
    Mutation,
    edit_manifest,
    edit_text,
    growable,
    manifest_level,
    mutation,
    pick_piece,
    placeholder,
    replica_pieces,
)
from .strategies import extension_names, json_values, short_text

__all__ = []


@mutation("version-major")
def _version_major(draw: st.DrawFn, ctx: Context) -> Mutation:
    version = draw(st.sampled_from(["2.0", "0.9", "3.1", "10.0", "999999.999999"]))
    restructured = draw(st.booleans())

    def edit(m: dict[str, Any]) -> None:
        m["format_version"] = version
        if restructured:
            m["shards"] = [{"tensors": sorted(m.pop("tensors"))}]

    what = " with a restructured manifest" if restructured else ""
    return manifest_level("version-major", "version-major", "4.2",
                           f"format_version {version}{what}: an unknown major version",
                           ctx, edit_manifest(edit))


@mutation("extension-unsupported")
def _extension(draw: st.DrawFn, ctx: Context) -> Mutation:
    name = draw(extension_names().filter(lambda n: n not in ctx.written.ignore_extensions))
    extra = draw(st.dictionaries(short_text, json_values(3), max_size=2))
    return manifest_level(
        "extension-unsupported", "extension-unsupported", "4.4",
        f"a must-understand extension {name!r} no reader knows", ctx,
        edit_manifest(lambda m: m.setdefault("extensions", {}).__setitem__(
            name, {**extra, "must_understand": True})))


@mutation("json-syntax")
def _json_syntax(draw: st.DrawFn, ctx: Context) -> Mutation:
    variants: dict[str, Callable[[bytes], bytes]] = {
        "a trailing comma": lambda t: t.rstrip()[:-1].rstrip() + b",\n}\n",
        "a comment": lambda t: b"/* written by hand */ " + t,
        "two JSON values": lambda t: t + t,
        "single quotes": lambda t: t.replace(b'"format"', b"'format'", 1),
    }
    what = draw(st.sampled_from(sorted(variants)))
    return manifest_level("json-syntax", "json-syntax", "3.2", f"the manifest has {what}",
                           ctx, edit_text(variants[what]))


@mutation("json-encoding")
def _json_encoding(draw: st.DrawFn, ctx: Context) -> Mutation:
    variants: dict[str, Callable[[bytes], bytes]] = {
        "starts with a byte order mark": lambda t: b"\xef\xbb\xbf" + t,
        "holds a byte that is not UTF-8": lambda t: t.replace(b'"shardspec"', b'"shard\xe9spec"',
                                                              1),
    }
    what = draw(st.sampled_from(sorted(variants)))
    return manifest_level("json-encoding", "json-encoding", "3.2", f"the manifest {what}",
                           ctx, edit_text(variants[what]))


@mutation("json-duplicate-name")
def _json_duplicate(draw: st.DrawFn, ctx: Context) -> Mutation:
    return manifest_level(
        "json-duplicate-name", "json-duplicate-name", "3.3",
        "the manifest names 'format' twice", ctx,
        edit_text(lambda t: t.replace(b"{", b'{"format": "shardspec", ', 1)))


@mutation("json-nonfinite")
def _json_nonfinite(draw: st.DrawFn, ctx: Context) -> Mutation:
    token = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]))
    return manifest_level(
        "json-nonfinite", "json-nonfinite", "3.3", f"quantization.config holds {token}", ctx,
        placeholder(lambda m: m["quantization"].__setitem__("config", {"loss": "@@TOKEN@@"}),
                     token))


@mutation("json-too-deep")
def _json_too_deep(draw: st.DrawFn, ctx: Context) -> Mutation:
    depth = draw(st.sampled_from([62, 100, 5000]))
    return manifest_level(
        "json-too-deep", "json-too-deep", "3.4",
        f"{depth} nested arrays in quantization.config (depth {depth + 3})", ctx,
        placeholder(lambda m: m["quantization"].__setitem__("config", {"x": "@@TOKEN@@"}),
                     "[" * depth + "]" * depth))


def _schema_variants(ctx: Context) -> dict[str, Callable[[Path], None]]:
    def setter(*path: Any, value: Any) -> Callable[[Path], None]:
        def edit(m: dict[str, Any]) -> None:
            target = m
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        return edit_manifest(edit)

    tp = ctx.m["layout"]["tp_size"]
    variants = {
        "the magic is 'safetensors'": setter("format", value="safetensors"),
        "quantization is missing": edit_manifest(lambda m: m.pop("quantization")),
        "layout is missing": edit_manifest(lambda m: m.pop("layout")),
        f"layout.tp_size is written {tp}.0": placeholder(
            lambda m: m["layout"].__setitem__("tp_size", "@@TOKEN@@"), f"{tp}.0"),
        "rank_order is 'pp-tp'": setter("layout", "rank_order", value="pp-tp"),
        "an extra file's path is '../config.json'": edit_manifest(
            lambda m: m.setdefault("extra_files", []).append(
                {"path": "../config.json", "size": 0, "checksums": {"sha256": "0" * 64}})),
        "generator has 257 characters": setter("generator", value="g" * 257),
        "a checksum is upper-case hex": edit_manifest(
            lambda m: next(file_records(m))["checksums"].update(sha256="A" * 64)),
    }
    if not any(True for _ in file_records(ctx.m)):
        del variants["a checksum is upper-case hex"]
    if ctx.m["format_version"] == format_version():  # not a newer minor: unknown is an error
        variants[f"an unknown top-level member in a {format_version()} manifest"] = setter(
            "load_hints", value={"prefetch": True})
    if ctx.tensors():
        name = ctx.tensors()[0]
        variants[f"tensor {name!r} has dtype 'FP32'"] = setter("tensors", name, "dtype",
                                                               value="FP32")
    return variants


@mutation("schema")
def _schema(draw: st.DrawFn, ctx: Context) -> Mutation:
    variants = _schema_variants(ctx)
    what = draw(st.sampled_from(sorted(variants)))
    return manifest_level("schema", "schema", "3.5", what, ctx, variants[what])


@mutation("layout-world-size")
def _world_size(draw: st.DrawFn, ctx: Context) -> Mutation:
    more = draw(st.integers(1, 3))
    return manifest_level(
        "layout-world-size", "layout-world-size", "5.1",
        f"world_size is {ctx.world + more}, the sizes multiply to {ctx.world}", ctx,
        edit_manifest(lambda m: m["layout"].__setitem__("world_size", ctx.world + more)))


@mutation("layout-ranks", lambda ctx: ctx.world > 1)
def _swap_ranks(draw: st.DrawFn, ctx: Context) -> Mutation:
    i = draw(st.integers(0, ctx.world - 2))
    j = draw(st.integers(i + 1, ctx.world - 1))

    def edit(m: dict[str, Any]) -> None:
        m["ranks"][i], m["ranks"][j] = m["ranks"][j], m["ranks"][i]

    return manifest_level("layout-ranks", "layout-ranks", "5.3",
                           f"the records of ranks {i} and {j} are swapped", ctx,
                           edit_manifest(edit))


@mutation("layout-rank-order")
def _rank_order(draw: st.DrawFn, ctx: Context) -> Mutation:
    rank = draw(st.integers(0, ctx.world - 1))
    axis = draw(st.sampled_from(["tp_rank", "pp_rank", "ep_rank"]))
    value = ctx.m["ranks"][rank][axis] + 1
    return manifest_level(
        "layout-rank-order", "layout-rank-order", "5.2",
        f"rank {rank} claims {axis} {value}", ctx,
        edit_manifest(lambda m: m["ranks"][rank].__setitem__(axis, value)))


@mutation("piece-rank", lambda ctx: bool(ctx.tensors()))
def _piece_rank(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, index = pick_piece(draw, ctx, ctx.tensors())
    rank = ctx.world + draw(st.integers(0, 100))
    return manifest_level(
        "piece-rank", "piece-rank", "7.2", f"a piece of {name!r} is on rank {rank} of "
        f"{ctx.world}", ctx,
        edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("rank", rank)))


@mutation("piece-duplicate", lambda ctx: bool(ctx.tensors()))
def _piece_duplicate(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, index = pick_piece(draw, ctx, ctx.tensors())

    def edit(m: dict[str, Any]) -> None:
        pieces = m["tensors"][name]["pieces"]
        twin = copy.deepcopy(pieces[index])
        if "offset" in twin:
            twin["replica"] = 65535
        pieces.append(twin)

    return manifest_level("piece-duplicate", "piece-duplicate", "7.2",
                           f"a rank holds two pieces of {name!r}", ctx, edit_manifest(edit))


@mutation("piece-bounds", lambda ctx: bool(ctx.tensors("global")))
def _piece_bounds(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, index = pick_piece(draw, ctx, ctx.tensors("global"))
    shape = ctx.m["tensors"][name]["shape"]
    piece = ctx.m["tensors"][name]["pieces"][index]
    if shape:
        d = draw(st.integers(0, len(shape) - 1))
        offset = list(piece["offset"])
        offset[d] = shape[d] - piece["shape"][d] + 1
    else:
        offset = [0]

    return manifest_level(
        "piece-bounds", "piece-bounds", "7.2",
        f"a piece of {name!r} {shape} at offset {offset} runs outside it", ctx,
        edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("offset",
                                                                                  offset)))


@mutation("coverage-gap", lambda ctx: bool(growable(ctx)))
def _coverage_gap(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, d = draw(st.sampled_from(growable(ctx)))
    shape = list(ctx.m["tensors"][name]["shape"])
    shape[d] += 1
    return manifest_level(
        "coverage-gap", "coverage-gap", "7.3",
        f"{name!r} is recorded as {shape}, one more than its pieces cover along dim {d}",
        ctx, edit_manifest(lambda m: m["tensors"][name].__setitem__("shape", shape)))


@mutation("coverage-overlap", lambda ctx: bool(replica_pieces(ctx)))
def _coverage_overlap(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, index = draw(st.sampled_from(replica_pieces(ctx)))
    return manifest_level(
        "coverage-overlap", "coverage-overlap", "7.3",
        f"a replica of {name!r} is numbered 0: two primary pieces overlap", ctx,
        edit_manifest(lambda m: m["tensors"][name]["pieces"][index].pop("replica")))


@mutation("replica-mismatch", lambda ctx: bool(replica_pieces(ctx, dims=1)))
def _replica_mismatch(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, index = draw(st.sampled_from(replica_pieces(ctx, dims=1)))
    shape = list(ctx.m["tensors"][name]["pieces"][index]["shape"])
    d = next(i for i, n in enumerate(shape) if n >= 2)
    shape[d] -= 1
    return manifest_level(
        "replica-mismatch", "replica-mismatch", "7.4",
        f"a replica of {name!r} has shape {shape}, which no primary piece has", ctx,
        edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("shape",
                                                                                 shape)))


@mutation("alias-target")
def _alias_target(draw: st.DrawFn, ctx: Context) -> Mutation:
    names = set(ctx.m["tensors"])
    alias = next(f"alias.{i}" for i in range(len(names) + 1) if f"alias.{i}" not in names)
    choices = {"a missing tensor": next(f"missing.{i}" for i in range(len(names) + 1)
                                        if f"missing.{i}" not in names),
               "itself": alias}
    if ctx.tensors("alias"):
        choices["another alias"] = ctx.tensors("alias")[0]
    what = draw(st.sampled_from(sorted(choices)))
    target = choices[what]
    return manifest_level(
        "alias-target", "alias-target", "7.6", f"{alias!r} is an alias of {what}", ctx,
        edit_manifest(lambda m: m["tensors"].__setitem__(alias, {"alias_of": target})))


@mutation("file-rank", lambda ctx: bool(ctx.tensors()))
def _file_rank(draw: st.DrawFn, ctx: Context) -> Mutation:
    name, index = pick_piece(draw, ctx, ctx.tensors())
    listed = {r["path"] for r in file_records(ctx.m)}
    path = next(f"unlisted-{i}.safetensors" for i in range(len(listed) + 1)
                if f"unlisted-{i}.safetensors" not in listed)
    return manifest_level(
        "file-rank", "file-rank", "6.1", f"a piece of {name!r} names {path!r}, which no rank "
        "lists", ctx,
        edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("file", path)))


@mutation("file-duplicate", lambda ctx: bool(ctx.files))
def _file_duplicate(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    return manifest_level(
        "file-duplicate", "file-duplicate", "2.1",
        f"{file.path!r} is listed again as an extra file", ctx,
        edit_manifest(lambda m: m.setdefault("extra_files", []).append(copy.deepcopy(
            next(r for r in file_records(m) if r["path"] == file.path)))))


@mutation("path-unsafe")
def _path_unsafe(draw: st.DrawFn, ctx: Context) -> Mutation:
    path = draw(st.sampled_from([MANIFEST_NAME, "/".join(["é" * 100] * 6)]))
    record = {"path": path, "size": 0, "checksums": {"sha256": "0" * 64}}
    what = "the manifest itself" if path == MANIFEST_NAME else "a path of 1205 UTF-8 bytes"
    return manifest_level(
        "path-unsafe", "path-unsafe", "2.2" if path != MANIFEST_NAME else "2.1",
        f"an extra file is {what}", ctx,
        edit_manifest(lambda m: m.setdefault("extra_files", []).append(record)))


@mutation("not-committed")
def _not_committed(draw: st.DrawFn, ctx: Context) -> Mutation:
    return manifest_level("not-committed", "not-committed", "2.3",
                           "shardspec.json was never written", ctx,
                           lambda root: (root / MANIFEST_NAME).unlink())


@mutation("shape-overflow", lambda ctx: bool(ctx.tensors()))
def _shape_overflow(draw: st.DrawFn, ctx: Context) -> Mutation:
    name = draw(st.sampled_from(ctx.tensors()))
    shape = draw(st.sampled_from([[2**62, 4], [2**32, 2**32], [2**63 - 1, 2]]))
    return manifest_level(
        "shape-overflow", "shape-overflow", "7.1",
        f"{name!r} has the logical shape {shape}, over 2^63 - 1 elements", ctx,
        edit_manifest(lambda m: m["tensors"][name].__setitem__(
            "logical", {"dtype": "BF16", "shape": shape})))
