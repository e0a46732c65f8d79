"""Opening a checkpoint and loading one rank's tensors onto that rank's device (SPEC 11)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from .format.errors import Finding, QuantizationError, RequestError, raise_first_error
from .format.manifest import Layout, Manifest
from .load.devices import DeviceLike, resolve_device
from .load.execute import execute_plan
from .load.plan import RankPlan, plan_rank
from .reshard.load import load_resharded
from .storage.location import Location, PathOrURL, locate
from .storage.manifest_file import read_manifest
from .storage.remote import RemoteRoot

__all__ = ["Checkpoint", "load_rank", "open_checkpoint"]


class Checkpoint:
    """A committed, checked checkpoint, on disk or in object storage. Opening reads only the
    manifest. ``path`` is the directory (a :class:`~pathlib.Path`) or the storage prefix (a
    :class:`~shardspec.storage.remote.RemoteRoot`, whose ``str`` is its URL)."""

    def __init__(
        self, path: Location, manifest: Manifest, warnings: list[Finding],
        manifest_sha256: str | None = None,
    ) -> None:
        self.path = path
        self.manifest = manifest
        #: Findings that did not stop the reader: newer minor version, ignored extensions.
        self.warnings = warnings
        #: SHA-256 of the manifest's bytes as read: ranks compare it to know they opened the
        #: same checkpoint.
        self.manifest_sha256 = manifest_sha256

    def __repr__(self) -> str:
        layout = self.layout
        return (f"<shardspec.Checkpoint {str(self.path)!r} tp={layout.tp_size} "
                f"pp={layout.pp_size} ep={layout.ep_size} tensors={len(self.manifest.tensors)}>")

    @property
    def layout(self) -> Layout:
        return self.manifest.layout

    @property
    def world_size(self) -> int:
        return self.manifest.world_size

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise RequestError(Finding(
                code="rank-out-of-range",
                message=f"rank {rank!r} is not in 0..{self.world_size - 1} "
                f"(world size {self.world_size})"))

    def plan(self, rank: int) -> RankPlan:
        """The reads ``rank`` makes: its files and the tensors each holds."""
        self._check_rank(rank)
        return plan_rank(self.manifest, rank)

    @property
    def is_remote(self) -> bool:
        return isinstance(self.path, RemoteRoot)

    def rank_files(self, rank: int) -> list[Path] | list[str]:
        """The data files ``rank`` reads: paths under the checkpoint directory, or URLs."""
        files = [f.record.path for f in self.plan(rank).files]
        if isinstance(self.path, RemoteRoot):
            return [self.path.url_of(name) for name in files]
        return [self.path / name for name in files]

    def load_rank(
        self,
        rank: int,
        device: DeviceLike = None,
        *,
        verify: bool = False,
        expect_quantization: str | None = None,
        layout: Layout | None = None,
        mmap: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Load ``rank``'s tensors onto ``device``, reading only that rank's files.

        ``device`` None means ``cuda:<LOCAL_RANK>`` where CUDA is available, else ``cpu``.
        ``verify`` checks every digest each file's record lists (SPEC 9.2) while reading.
        ``expect_quantization`` (a method name, ``"none"`` for unquantized) refuses a checkpoint
        quantized otherwise (SPEC 8.3).
        Aliases come back as the same tensor as their target.

        ``layout`` other than the checkpoint's reshards on load (SPEC 11.3): ``rank`` is a rank
        of ``layout``, and only the byte ranges of the source files that overlap its pieces are
        read. Rank-local tensors cannot be resharded (RequestError ``reshard-rank-local``).
        With ``verify`` every source file the load reads from is hashed whole, so verifying
        reads those files in full.

        ``mmap`` (device ``cpu`` only) returns tensors backed by copy-on-write mappings of the
        data files instead of copies: no byte is read until touched, and writes to the tensors
        never reach the files (safetensors' ``load_file`` does the same). A data file that is
        truncated while such tensors live makes touching them fail with SIGBUS, as with any
        mapping; copy what must outlive the files.
        """
        target = resolve_device(device)
        if mmap and isinstance(self.path, RemoteRoot):
            raise RequestError(Finding(
                code="device-invalid",
                message=f"mmap=True maps local files; {self.path.url} is in object storage"))
        if mmap and target.type != "cpu":
            raise RequestError(Finding(
                code="device-invalid",
                message=f"mmap=True maps files into host memory: it needs device 'cpu', "
                f"not {str(target)!r}"))
        if layout is not None and layout != self.layout:
            if mmap:
                raise RequestError(Finding(
                    code="reshard-unsupported",
                    message="mmap=True cannot be combined with resharding (layout=...): a "
                    "resharded piece is gathered into new memory",
                    hint="load with mmap=False, or reshard to a new directory first"))
            self._check_quantization(expect_quantization)
            return load_resharded(self.path, self.manifest, rank, layout, target, verify=verify)
        plan = self.plan(rank)
        self._check_quantization(expect_quantization)
        return execute_plan(self.path, plan, target, verify=verify, mmap=mmap)

    def _check_quantization(self, expect_quantization: str | None) -> None:
        method = self.manifest.quantization.method
        if expect_quantization is not None and expect_quantization != method:
            raise QuantizationError(Finding(
                code="quantization-mismatch", file="shardspec.json",
                json_path="$.quantization.method",
                message=f"asked to load with quantization {expect_quantization!r} but the "
                f"checkpoint is quantized with {method!r}"))


def open_checkpoint(
    path: PathOrURL, *, ignore_extensions: Collection[str] = (),
    storage_options: dict[str, Any] | None = None,
) -> Checkpoint:
    """Open and check the checkpoint at ``path`` (its manifest; data files are read on load).

    ``path`` is a directory or an object-storage URL (``s3://bucket/prefix``, any fsspec
    protocol), ``storage_options`` the fsspec filesystem's options for a URL (credentials, an
    endpoint). ``ignore_extensions`` names must-understand extensions the caller knows are safe
    to ignore. Raises a :class:`shardspec.ShardspecError` subclass naming the rule that failed.
    """
    root = locate(path, storage_options)
    parsed = read_manifest(root, ignore_extensions=ignore_extensions)
    warnings = raise_first_error(parsed.findings)
    assert parsed.manifest is not None, "no errors means the manifest was built"
    return Checkpoint(root, parsed.manifest, warnings, parsed.sha256)


def load_rank(
    path: PathOrURL,
    rank: int,
    device: DeviceLike = None,
    *,
    verify: bool = False,
    expect_quantization: str | None = None,
    ignore_extensions: Collection[str] = (),
    layout: Layout | None = None,
    mmap: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Shortcut: ``open(path).load_rank(rank, device, ...)``."""
    checkpoint = open_checkpoint(path, ignore_extensions=ignore_extensions,
                                 storage_options=storage_options)
    return checkpoint.load_rank(
        rank, device, verify=verify, expect_quantization=expect_quantization, layout=layout,
        mmap=mmap,
    )
