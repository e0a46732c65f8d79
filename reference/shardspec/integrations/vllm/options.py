"""The plugin's options: vLLM's ``model_loader_extra_config`` for ``load_format="shardspec"``.

Pure Python (no vLLM import), so the rules are tested without an engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...storage.remote import is_remote
from .plan_cache import default_cache_dir

__all__ = ["LoaderOptions", "OptionsError"]


class OptionsError(ValueError):
    """An option vLLM passed in ``model_loader_extra_config`` that the plugin cannot use."""


@dataclass(frozen=True)
class LoaderOptions:
    """``verify``: check every data file a worker reads against the manifest's checksums
    (SPEC 9.2) while loading. ``save_to``: a new directory where the workers write the state
    they loaded, under vLLM's own names at the engine's layout, before vLLM post-processes it
    (a checkpoint that then loads without resharding). ``ignore_extensions``: must-understand
    extensions the caller knows are safe to ignore (SPEC 4.4). ``plan_cache``: the directory
    where placement plans are kept between starts (:mod:`.plan_cache`; default
    ``~/.cache/shardspec/vllm-plans``), or false to record the plan on every start.

    ``source``: the checkpoint's object-storage URL (``s3://bucket/prefix``, any fsspec
    protocol), read in place of vLLM's ``model``, which is then a local directory holding the
    checkpoint's manifest and extra files (``shardspec fetch-config``): vLLM refuses an
    object-storage ``model`` for any load format but its own streamers. ``storage_options``:
    the fsspec filesystem's options for ``source`` (an endpoint, credentials), over what the
    environment gives (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...)."""

    verify: bool = False
    save_to: str | None = None
    ignore_extensions: tuple[str, ...] = ()
    plan_cache: str | bool = True
    source: str | None = None
    storage_options: dict[str, Any] | None = None

    def plan_cache_dir(self) -> Path | None:
        """Where plans are kept, or None where they are not."""
        if self.plan_cache is False:
            return None
        return default_cache_dir() if self.plan_cache is True else Path(self.plan_cache)

    @classmethod
    def parse(cls, extra: Mapping[str, Any] | None) -> LoaderOptions:
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(KEYS))
        if unknown:
            raise OptionsError(
                f"model_loader_extra_config for load_format 'shardspec' has unknown keys "
                f"{unknown}; it takes 'verify' (bool), 'save_to' (a directory), "
                f"'ignore_extensions' (a list of names), 'plan_cache' (a directory, or "
                f"false), 'source' (an object-storage URL) and 'storage_options' (an object)")
        verify = extra.get("verify", False)
        if not isinstance(verify, bool):
            raise OptionsError(f"model_loader_extra_config 'verify' must be true or false, got "
                               f"{verify!r}")
        save_to = extra.get("save_to")
        if save_to is not None and not _is_path(save_to):
            raise OptionsError(f"model_loader_extra_config 'save_to' must be a directory path, "
                               f"got {save_to!r}")
        ignore = extra.get("ignore_extensions", ())
        if not isinstance(ignore, (list, tuple)) or not all(isinstance(i, str) and i
                                                            for i in ignore):
            raise OptionsError("model_loader_extra_config 'ignore_extensions' must be a list of "
                               f"extension names, got {ignore!r}")
        plan_cache = extra.get("plan_cache", True)
        if not isinstance(plan_cache, bool) and not _is_path(plan_cache):
            raise OptionsError(f"model_loader_extra_config 'plan_cache' must be a directory path "
                               f"or false, got {plan_cache!r}")
        source, storage_options = _source(extra)
        return cls(verify=verify, save_to=None if save_to is None else os.fspath(save_to),
                   ignore_extensions=tuple(ignore),
                   plan_cache=plan_cache if isinstance(plan_cache, bool)
                   else os.fspath(plan_cache), source=source, storage_options=storage_options)


#: The keys ``model_loader_extra_config`` takes.
KEYS = ("verify", "save_to", "ignore_extensions", "plan_cache", "source", "storage_options")


def _source(extra: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """``source`` (an object-storage URL) and its ``storage_options`` (fsspec keyword
    arguments: names, with the ``*_kwargs`` among them objects in turn)."""
    source = extra.get("source")
    if source is not None and not (isinstance(source, str) and is_remote(source)
                                   and source.split("://", 1)[1].strip("/")):
        raise OptionsError(
            f"model_loader_extra_config 'source' must be an object-storage URL such as "
            f"'s3://bucket/prefix', got {source!r}; a local checkpoint is vLLM's model itself")
    options = extra.get("storage_options")
    if options is None:
        return source, None
    if source is None:
        raise OptionsError("model_loader_extra_config 'storage_options' apply to 'source', "
                           "which is not given")
    if not isinstance(options, dict):
        raise OptionsError(f"model_loader_extra_config 'storage_options' must be an object of "
                           f"the fsspec filesystem's options, got {options!r:.80}")
    for name, value in options.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise OptionsError(f"model_loader_extra_config 'storage_options': {name!r} is not "
                               "an option name")
        if name.endswith("_kwargs") and not isinstance(value, dict):
            raise OptionsError(f"model_loader_extra_config 'storage_options': {name} must be "
                               f"an object of options, not {value!r:.40}")
    return source, dict(options)


def _is_path(value: Any) -> bool:
    """A non-empty path without NUL: an empty one would name the working directory, and the
    system takes none with a NUL (refused here, not when the workers write)."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    path = os.fsdecode(os.fspath(value))
    return bool(path) and "\0" not in path
