"""Semantic rules a JSON Schema cannot express (SPEC 3.5): layout, files, pieces, coverage.

Each check yields findings; the validator reports them all, the reader raises the first error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .dtypes import DTYPES, bit_count, byte_size, element_count
from .errors import Finding
from .joins import JOINS_SINCE_MINOR, allows_joins, join_of, several_per_rank
from .limits import MANIFEST_NAME, MAX_NAME_BYTES, MAX_PATH_BYTES
from .manifest import Alias, Manifest, Piece, TensorRecord
from .overlap import first_overlap
from .ties import check_ties

__all__ = ["check_manifest", "path_problem"]


def check_manifest(manifest: Manifest) -> Iterator[Finding]:
    """Every semantic problem of a schema-valid manifest."""
    yield from _check_layout(manifest)
    yield from _check_files(manifest)
    yield from _check_tensors(manifest)
    yield from check_ties(manifest)


def _check_layout(m: Manifest) -> Iterator[Finding]:
    layout = m.layout
    if layout.world_size != layout.size:
        yield Finding(
            code="layout-world-size",
            message=f"world_size is {layout.world_size} but tp_size x pp_size x ep_size "
            f"is {layout.size}",
            json_path="$.layout.world_size",
        )
    if len(m.ranks) != layout.world_size:
        yield Finding(
            code="layout-world-size",
            message=f"{len(m.ranks)} rank records for a world size of {layout.world_size}",
            json_path="$.ranks",
        )
    for index, record in enumerate(m.ranks):
        where = f"$.ranks[{index}]"
        if record.rank != index:
            yield Finding(
                code="layout-ranks",
                message=f"ranks[{index}] is rank {record.rank}; ranks are listed in order "
                "from 0, each once",
                json_path=f"{where}.rank",
            )
            continue
        sizes = {"tp_rank": layout.tp_size, "pp_rank": layout.pp_size, "ep_rank": layout.ep_size}
        actual = {"tp_rank": record.tp_rank, "pp_rank": record.pp_rank, "ep_rank": record.ep_rank}
        if layout.world_size == layout.size and actual != layout.coordinates(record.rank):
            bad = [f"{k}={v} (size {sizes[k]})" for k, v in actual.items()]
            yield Finding(
                code="layout-rank-order",
                message=f"rank {record.rank} has {', '.join(bad)} but rank order "
                f"{layout.rank_order!r} gives {layout.coordinates(record.rank)}",
                json_path=where,
            )


def path_problem(path: str) -> str | None:
    """Why ``path`` is not an allowed relative path (SPEC 2.2), or None when it is."""
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    if not path:
        return "empty"
    if path.startswith("/"):
        return "absolute"
    if "\\" in path or "\x00" in path:
        return "contains a backslash or NUL"
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            return f"has a {segment or 'empty'!r} segment"
    return None


def _check_files(m: Manifest) -> Iterator[Finding]:
    seen: dict[str, str] = {}
    listed = [
        (f"$.ranks[{r.rank}].files[{i}]", f) for r in m.ranks for i, f in enumerate(r.files)
    ] + [(f"$.extra_files[{i}]", f) for i, f in enumerate(m.extra_files)]
    for where, record in listed:
        problem = path_problem(record.path)
        if problem:
            yield Finding(code="path-unsafe", message=f"path is {problem}", file=record.path,
                          json_path=f"{where}.path")
        elif record.path == MANIFEST_NAME:
            yield Finding(code="path-unsafe", message="the manifest cannot list itself",
                          file=record.path, json_path=f"{where}.path")
        if record.path in seen:
            yield Finding(code="file-duplicate",
                          message=f"listed again; first listed at {seen[record.path]}",
                          file=record.path, json_path=where)
        else:
            seen[record.path] = where
    yield from _check_nesting(seen)


def _check_nesting(seen: dict[str, str]) -> Iterator[Finding]:
    """SPEC 2.1 rule 6: no listed path lies under another listed path or the manifest (a
    folder there cannot also be a file, though object storage holds both keys)."""
    under = _listed_folders(seen)
    for path, where in seen.items():
        folder = MANIFEST_NAME if path.startswith(MANIFEST_NAME + "/") else under.get(path)
        if folder is not None:
            what = "the manifest" if folder == MANIFEST_NAME else f"listed at {seen[folder]}"
            yield Finding(code="path-unsafe", file=path, json_path=f"{where}.path",
                          message=f"lies under {folder!r} ({what}), which is a file: a path "
                          "cannot be both a file and a folder (SPEC 2.1 rule 6)")


def _listed_folders(paths: Iterable[str]) -> dict[str, str]:
    """Each path that lies under another of ``paths`` -> that one. In sorted order, every path
    between Q and a path starting with Q starts with Q too: a stack of the prefixes of the
    current path, each with the nearest one it lies under, answers each in constant time
    (comparing every prefix of every path is quadratic in a path's length)."""
    found: dict[str, str] = {}
    stack: list[tuple[str, str | None]] = []  # (path, the nearest listed folder it lies under)
    for path in sorted(paths):
        while stack and not path.startswith(stack[-1][0]):
            stack.pop()
        folder = None
        if stack:
            top, above = stack[-1]
            folder = top if path[len(top):len(top) + 1] == "/" else above
        if folder is not None:
            found[path] = folder
        stack.append((path, folder))
    return found


def _check_tensors(m: Manifest) -> Iterator[Finding]:
    files_of_rank = {r.rank: {f.path for f in r.files} for r in m.ranks}
    tie_bases = tie_bases_of(m)
    joins = allows_joins(m.format_version)
    for name, record in m.tensors.items():
        if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            yield Finding(code="schema", message=f"name is longer than {MAX_NAME_BYTES} bytes",
                          tensor=name[:64])
        if isinstance(record, Alias):
            target = m.tensors.get(record.alias_of)
            if not isinstance(target, TensorRecord):
                what = "an alias" if isinstance(target, Alias) else "not a tensor of the manifest"
                yield Finding(code="alias-target", tensor=name,
                              message=f"alias_of {record.alias_of!r}, which is {what}",
                              json_path=f"$.tensors[{name!r}].alias_of")
            continue
        yield from _check_pieces(name, record, files_of_rank)
        yield from check_several_per_rank(name, record, name in tie_bases, joins)


def tie_bases_of(m: Manifest) -> set[str]:
    """The names that some tensor's ``tied_to`` names (SPEC 8.4)."""
    return {r.tied_to.tensor for r in m.tensors.values()
            if isinstance(r, TensorRecord) and r.tied_to is not None}


def check_several_per_rank(name: str, record: TensorRecord, is_tie_base: bool,
                           joins: bool = True) -> Iterator[Finding]:
    """SPEC 7.2 rules 3 and 7: a rank's several pieces of one tensor are allowed and joinable;
    not ``joins``: the manifest's version predates them (4.2 rule 4)."""
    for rank, held in several_per_rank(record.pieces).items():
        if not joins:
            why = (f"only a manifest of format 1.{JOINS_SINCE_MINOR} or later may join pieces, "
                   "and a manifest is read by its own version's rules (SPEC 4.2 rule 4)")
        elif record.shape is None:
            why = "a rank-local tensor has one piece per rank (SPEC 7.5)"
        elif record.tied_to is not None or is_tie_base:
            why = "a tied tensor and its base have one piece per rank (SPEC 8.4)"
        else:
            join = join_of(held, DTYPES[record.dtype].bits)
            if not isinstance(join, str):
                continue
            why = f"they cannot be joined: {join}"
        yield Finding(code="piece-duplicate", tensor=name, json_path=f"$.tensors[{name!r}].pieces",
                      message=f"rank {rank} holds {len(held)} pieces; {why}")


def _check_pieces(
    name: str, record: TensorRecord, files_of_rank: dict[int, set[str]]
) -> Iterator[Finding]:
    dtype = DTYPES[record.dtype]
    shapes = [(dtype, record.shape)] if record.shape is not None else []
    if record.logical is not None:
        shapes.append((DTYPES[record.logical.dtype], record.logical.shape))
    for of, shape in shapes:  # SPEC 7.1 rule 4: element and bit counts
        if bit_count(of, shape) is None:
            what = "elements" if element_count(shape) is None else f"bits as {of.name}"
            yield Finding(code="shape-overflow", tensor=name,
                          message=f"shape {list(shape)} has 2^63 or more {what}")
    in_bounds: list[Piece] = []
    for index, piece in enumerate(record.pieces):
        if piece.rank not in files_of_rank:
            yield Finding(code="piece-rank", tensor=name, json_path=f"{_where(name, index)}.rank",
                          message=f"rank {piece.rank} is not in the layout")
            continue
        if piece.file not in files_of_rank[piece.rank]:
            yield Finding(code="file-rank", tensor=name, file=piece.file,
                          json_path=f"{_where(name, index)}.file",
                          message=f"the piece of rank {piece.rank} lies in a file rank "
                          f"{piece.rank} does not own",
                          hint="a rank's tensors live only in its own files (SPEC 6.1)")
        if byte_size(dtype, piece.shape) is None:
            yield Finding(code="st-size", tensor=name, json_path=f"{_where(name, index)}.shape",
                          message=f"a piece of shape {list(piece.shape)} in {dtype.name} does "
                          "not fill whole bytes below 2^63")
            # still a slice of the tensor: bounds and coverage (7.2, 7.3) apply to it
        if record.shape is None:
            continue
        bounds = _bounds_problem(piece, record.shape)
        if bounds:
            yield Finding(code="piece-bounds", tensor=name, json_path=_where(name, index),
                          message=bounds)
        else:
            in_bounds.append(piece)
    if record.shape is not None and element_count(record.shape) is not None:
        yield from _check_coverage(name, record.shape, in_bounds)


def _where(name: str, index: int) -> str:
    """The JSON path of a piece, built only for a finding (a manifest may have 100,000)."""
    return f"$.tensors[{name!r}].pieces[{index}]"


def _bounds_problem(piece: Piece, shape: tuple[int, ...]) -> str | None:
    offset = piece.offset or ()
    if not (len(offset) == len(piece.shape) == len(shape)):
        return (f"offset {list(offset)} and shape {list(piece.shape)} must each have "
                f"{len(shape)} dimensions like the tensor's shape {list(shape)}")
    for dim, (start, size, total) in enumerate(zip(offset, piece.shape, shape, strict=True)):
        if start + size > total:
            return (f"dimension {dim}: offset {start} + size {size} passes the tensor's "
                    f"size {total}")
    return None


def _volume(shape: Iterable[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _check_coverage(name: str, shape: tuple[int, ...], pieces: list[Piece]) -> Iterator[Finding]:
    """SPEC 7.3 and 7.4: replica-0 pieces cover every element once; replicas copy one of them."""
    if len(pieces) != len([p for p in pieces if p.offset is not None]):
        return
    total = _volume(shape)
    primaries = [p for p in pieces if p.replica == 0]
    primary_boxes = {(p.offset, p.shape) for p in primaries}
    for piece in pieces:
        if piece.replica and (piece.offset, piece.shape) not in primary_boxes:
            yield Finding(code="replica-mismatch", tensor=name,
                          message=f"rank {piece.rank}'s replica {piece.replica} (offset "
                          f"{list(piece.offset or ())}, shape {list(piece.shape)}) copies no "
                          "replica-0 piece")
    if total == 0:
        return
    solid = [p for p in primaries if _volume(p.shape)]
    boxes = [(p.offset or (), p.shape) for p in solid]
    overlap = first_overlap(boxes)
    if overlap is not None:
        a, b = solid[overlap[0]], solid[overlap[1]]
        yield Finding(code="coverage-overlap", tensor=name,
                      message=f"the pieces of ranks {a.rank} and {b.rank} overlap",
                      hint="mark copies of the same slice with distinct 'replica' numbers")
        return
    covered = sum(_volume(s) for _, s in boxes)
    if covered != total:
        yield Finding(code="coverage-gap", tensor=name,
                      message=f"replica-0 pieces cover {covered} of {total} elements")
