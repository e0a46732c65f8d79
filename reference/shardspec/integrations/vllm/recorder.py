"""Where each checkpoint tensor lands in a model, learnt by running the model's own loader once.

The model's ``load_weights`` is handed *stand-ins*: tensors on the ``meta`` device with each
checkpoint tensor's global shape and dtype, which hold no bytes. Its weight loaders narrow,
slice, fuse (``qkv_proj``, ``gate_up_proj``), pad (the vocabulary) and stack (experts) by
vLLM's own rules; a dispatch mode watches every operation and, instead of doing them, records

- each copy of a view of a stand-in into a view of a parameter or buffer (a :class:`Copy`:
  which region of which checkpoint tensor lands in which region of which target), and
- each fill of a target with a constant (a :class:`Fill`: the padded rows of the vocabulary).

Views share their base's storage, so a region is a storage offset, strides and a shape. What
cannot be expressed so (a loader that computes on the weights, converts their dtype, or writes
a target some other way) is noted per checkpoint tensor in :attr:`Recording.unplaceable`: those
tensors go through the loader for real, and the regions of them it computed on are kept in
:attr:`Recording.taken`, so that what a worker reads for it can be checked to hold them.
Nothing of the model is written while recording.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Copy", "Fill", "Recording", "RecordingFailed", "Region", "StandIn", "record"]

_aten = torch.ops.aten
_FILLS = {_aten.fill_.Scalar, _aten.zero_.default}


@dataclass(frozen=True)
class Region:
    """A strided view of a storage, in elements of the view's dtype."""

    offset: int
    strides: tuple[int, ...]
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Region:
        return cls(int(tensor.storage_offset()), tuple(tensor.stride()),
                   tuple(int(n) for n in tensor.shape))


@dataclass(frozen=True)
class StandIn:
    """One tensor handed to ``load_weights``: its name, the tensor holding its data (an alias's
    target), and that tensor's global shape and dtype."""

    name: str
    data: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Copy:
    """Region ``src`` of checkpoint tensor ``source`` (global, contiguous) is copied into region
    ``dst`` of the storage of target ``target``."""

    source: str
    src: Region
    target: str
    dst: Region


@dataclass(frozen=True)
class Fill:
    """Region ``dst`` of target ``target`` is set to ``value``."""

    target: str
    dst: Region
    value: float


@dataclass
class Recording:
    """What one run of ``load_weights`` on stand-ins did."""

    copies: list[Copy] = field(default_factory=list)
    fills: list[Fill] = field(default_factory=list)
    #: checkpoint tensor -> why its placement could not be recorded
    unplaceable: dict[str, str] = field(default_factory=dict)
    #: targets written in a way that is not recorded (by the unplaceable tensors)
    unplaced_targets: set[str] = field(default_factory=set)
    #: the target names ``load_weights`` reported loaded (None where it reports nothing)
    loaded: set[str] | None = None
    #: checkpoint tensor -> regions of it the loader computed on (not copied as they are)
    taken: dict[str, list[Region]] = field(default_factory=dict)


class RecordingFailed(RuntimeError):
    """``load_weights`` did not run to its end on stand-ins (it needed the weights' values)."""


def record(load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], Any],
           stand_ins: list[StandIn], targets: dict[str, torch.Tensor]) -> Recording:
    """Run ``load_weights`` on stand-ins of ``stand_ins`` and record where they land among
    ``targets`` (the model's parameters and buffers by name; names sharing a storage are one
    target, the first name)."""
    watcher = _Watcher(targets)
    try:
        with watcher:
            loaded = load_weights(watcher.feed(stand_ins))
    except RecordingFailed:
        raise
    except Exception as error:  # the loader needed what a stand-in does not hold
        raise RecordingFailed(f"{type(error).__name__}: {error}  (while loading "
                              f"{watcher.current!r})") from error
    watcher.recording.loaded = None if loaded is None else set(loaded)
    return watcher.recording


def _storage(tensor: torch.Tensor) -> int:
    # The storage's own handle: equal for a tensor and all its views, whatever the device.
    return int(tensor.untyped_storage()._cdata)


class _Watcher(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's own typing
    def __init__(self, targets: dict[str, torch.Tensor]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.recording = Recording()
        self.targets: dict[int, str] = {}
        for name, tensor in targets.items():
            self.targets.setdefault(_storage(tensor), name)
        self.sources: dict[int, set[str]] = {}  # stand-in storage (or computed from them)
        self.current = ""  # the tensor load_weights works on now
        self.computed: set[int] = set()  # storages of values computed from stand-ins
        self._alive: list[torch.Tensor] = []  # keeps storage handles from being reused

    def feed(self, stand_ins: list[StandIn]) -> Iterator[tuple[str, torch.Tensor]]:
        for item in stand_ins:
            tensor = torch.empty(item.shape, dtype=item.dtype, device="meta")
            self._alive.append(tensor)
            self.sources[_storage(tensor)] = {item.data}
            self.current = item.data
            yield item.name, tensor

    def _taken(self, tensors: Iterable[torch.Tensor]) -> None:
        """Note the regions of stand-ins (not of values computed from them) in ``tensors``."""
        for tensor in tensors:
            storage = _storage(tensor)
            if storage in self.computed:
                continue
            for name in self.sources.get(storage, ()):
                self.recording.taken.setdefault(name, []).append(Region.of(tensor))

    def _unplaceable(self, names: Iterable[str], why: str) -> None:
        for name in names:
            self.recording.unplaceable.setdefault(name, why)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sources = set().union(*(self.sources.get(_storage(t), set()) for t in tensors))
        written = _written_targets(func, args, self.targets)
        if written:
            self._write(func, args, written, sources)
            return args[0]
        if sources and not getattr(func, "is_view", False):
            self._taken(tensors)
        out = func(*args, **kwargs)
        if sources and not getattr(func, "is_view", False):
            # A value computed from stand-ins: where it lands cannot be expressed as a read.
            for result in tree_leaves(out):
                if isinstance(result, torch.Tensor):
                    self.sources.setdefault(_storage(result), set()).update(sources)
                    self.computed.add(_storage(result))
                    self._alive.append(result)
        return out

    def _write(self, func: Any, args: Any, written: str, sources: set[str]) -> None:
        dst = args[0]
        if func is _aten.copy_.default and sources:
            src = args[1]
            if (_storage(src) in self.computed or src.dtype != dst.dtype
                    or tuple(src.shape) != tuple(dst.shape)):
                why = ("converted from " + str(src.dtype) if src.dtype != dst.dtype
                       else "computed on before it is copied" if _storage(src) in self.computed
                       else "broadcast into its parameter")
                self._unplaceable(sources, why)
                self._taken([src])
                self.recording.unplaced_targets.add(written)
                return
            (source,) = sources
            self.recording.copies.append(Copy(source, Region.of(src), written, Region.of(dst)))
        elif func in _FILLS and not sources:
            value = 0.0 if func is _aten.zero_.default else float(args[1])
            self.recording.fills.append(Fill(written, Region.of(dst), value))
        else:
            self.recording.unplaced_targets.add(written)
            self._unplaceable(sources or {self.current},
                              f"written into {written!r} by {func} (not a copy)")


def _written_targets(func: Any, args: Any, targets: dict[int, str]) -> str | None:
    """The target an in-place operation writes (its first mutated argument), if any."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    for spec, value in zip(schema.arguments, args, strict=False):
        info = spec.alias_info
        if info is not None and info.is_write and isinstance(value, torch.Tensor):
            name = targets.get(_storage(value))
            if name is not None:
                return name
    return None
