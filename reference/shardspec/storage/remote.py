"""Checkpoints in object storage, through fsspec: a prefix, its objects, ranged reads (SPEC 2.4).

A remote checkpoint is a URL prefix (``s3://bucket/prefix``, ``gs://``, ``az://``, ``hf://``,
``memory://`` or any other fsspec protocol). A manifest path names the object ``prefix/path``
after the lexical checks of SPEC 2.2; object stores have no symlinks and no ``..``, so a checked
path cannot name an object outside the prefix. Nothing is listed: the manifest alone says which
objects exist.

Every read is one GET, retried on transient failures, several in flight at once, and timed:
the store's :class:`~shardspec.storage.remote_link.Link` sizes the requests. On S3 each answer
also reports the object's size and version (:mod:`~shardspec.storage.remote_s3`), which the
caller checks before the body is read; other stores are asked with a metadata request
(:meth:`RemoteRoot.version`). :class:`~shardspec.storage.remote_files.RemoteObject` reads one
object as one version (SPEC 9.3).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ..format.checks import path_problem
from ..format.errors import Finding, IntegrityError, PathError, ShardspecError, StorageError
from . import remote_link
from .remote_link import Link, link_for
from .remote_s3 import Cut, RangeNotSatisfiable, Reported, is_s3, s3_get, s3_read_into

__all__ = [
    "REQUESTS_IN_FLIGHT",
    "RETRIES",
    "ObjectVersion",
    "RemoteRoot",
    "Traffic",
    "describe_version",
    "is_remote",
    "local_path",
    "wait_all",
]

#: Requests in flight at once per load, validation or copy.
REQUESTS_IN_FLIGHT = 16

#: Attempts of one request on a transient failure (a 5xx, a dropped connection, a short body).
RETRIES = 4

#: First wait between attempts, in seconds; it doubles with each attempt.
RETRY_WAIT = 0.05

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: SPEC 2.4 rule 1: characters that URLs and store clients give a meaning (an escape, a query,
#: a fragment, s3fs's ``?versionId=``), and control characters.
_URL_SPECIAL = re.compile(r"[%?#\x00-\x1f\x7f]")

#: Exceptions of these libraries are the store's or the network's answers, worth another try
#: (the ones that are not, FileNotFoundError and PermissionError, are told apart first).
_CLIENT_MODULES = frozenset({
    "aiohttp", "aiobotocore", "botocore", "urllib3", "requests", "http", "fsspec", "s3fs",
    "gcsfs", "adlfs", "azure", "google", "huggingface_hub", "ssl", "socket",
})

#: Credential errors of the usual clients: refused before any request is answered.
_CREDENTIAL_ERRORS = frozenset({
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
    "NoAuthTokenError", "ClientAuthenticationError", "DefaultCredentialsError", "RefreshError",
})

#: Errors of shardspec's own code paths: a bug, never retried or disguised as a storage failure.
_BUGS = (TypeError, AttributeError, KeyError, IndexError, NameError, AssertionError)

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()

#: fsspec ``info`` fields that identify an object's content, most specific first: S3's ETag and
#: version id, GCS's generation, Azure's etag, the Hub's blob id; memory and local files have
#: only their times.
_VERSION_FIELDS = ("VersionId", "ETag", "generation", "etag", "blob_id", "mtime", "created")

T = TypeVar("T")


def is_remote(path: object) -> bool:
    """Whether ``path`` is a URL for fsspec (``file://`` URLs are local paths)."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def local_path(path: str) -> str:
    """``file:///a/b`` -> ``/a/b``; anything else unchanged."""
    return path[len("file://"):] if path.startswith("file://") else path


@dataclass
class Traffic:
    """What a :class:`RemoteRoot` asked of the store: for benchmarks, tests and the curious."""

    #: GETs answered (retries not counted twice)
    reads: int = 0
    #: bytes those reads returned
    bytes_read: int = 0
    #: metadata requests (size and version: a HEAD; none on S3, whose GETs report both)
    stats: int = 0


@dataclass(frozen=True)
class ObjectVersion:
    """What identifies one object's content while it is read: its size and version fields."""

    size: int
    tag: tuple[tuple[str, str], ...]


def _check_options(url: str, options: dict[str, Any]) -> None:
    """Storage options are keyword arguments of the filesystem's class: names, and the
    ``*_kwargs`` among them (``client_kwargs``, ``config_kwargs``, ...) objects in turn."""
    for name, value in options.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise _options_refused(url, f"{name!r} is not an option name")
        if name.endswith("_kwargs") and not isinstance(value, dict):
            raise _options_refused(url, f"{name} must be an object of options, not "
                                   f"{type(value).__name__} {value!r:.40}")


def _make_client(url: str, filesystem: Any) -> None:
    """Build s3fs's client now: it takes the storage options only then, and an option it
    refuses would otherwise surface as a TypeError at the first request."""
    if not is_s3(filesystem):
        return
    try:
        filesystem.connect()
    except Exception as exc:  # noqa: BLE001 - botocore's and aiobotocore's own types
        raise _options_refused(url, f"{type(exc).__name__}: {exc}") from None


def _options_refused(url: str, why: object) -> StorageError:
    return StorageError(Finding(
        code="storage-unavailable", file=url,
        message=f"the storage options do not make a client for this URL: {why}",
        hint="check --storage-options or SHARDSPEC_STORAGE_OPTIONS (the fsspec filesystem's "
        "keyword arguments, e.g. s3fs's S3FileSystem)"))


def wait_all(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; the first error raised, the ones not started cancelled."""
    try:
        for future in futures:
            future.result()
    finally:
        for future in futures:
            future.cancel()


class RemoteRoot:
    """A checkpoint prefix in object storage, and the reads and writes made under it."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None,
                 filesystem: Any = None) -> None:
        try:
            import fsspec  # noqa: PLC0415 - only remote checkpoints need fsspec
        except ImportError:
            raise StorageError(Finding(
                code="storage-unavailable", file=url,
                message="reading object storage needs fsspec (and the filesystem's package)",
                hint="pip install 'shardspec[s3]' (or fsspec plus gcsfs, adlfs, ...)")) from None
        self.url = url.rstrip("/")
        if filesystem is None:
            _check_options(url, storage_options or {})
            try:
                filesystem, prefix = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
            except (ImportError, ValueError) as exc:
                raise StorageError(Finding(
                    code="storage-unavailable", file=url,
                    message=f"no fsspec filesystem for this URL: {exc}",
                    hint="install the filesystem's package (s3fs for s3://: "
                    "pip install 'shardspec[s3]')")) from None
            except TypeError as exc:  # an option the filesystem's class does not take
                raise _options_refused(url, exc) from None
            _make_client(url, filesystem)
        else:
            prefix = filesystem._strip_protocol(self.url)
        self.fs = filesystem
        self.prefix = str(prefix).rstrip("/")
        #: the store's measured latency and throughput, which size the requests
        self.link: Link = link_for(filesystem)
        #: whether every GET's answer reports the object's size and version (S3)
        self.answers_carry_versions = is_s3(filesystem)
        #: running totals of the requests made through this root
        self.traffic = Traffic()
        self._traffic_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteRoot({self.url!r})"

    def __str__(self) -> str:
        return self.url

    def url_of(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def key(self, relative: str) -> str:
        """The object path of ``relative``; PathError if SPEC 2.2 forbids the path."""
        problem = path_problem(relative)
        if problem:
            raise PathError(Finding(code="path-unsafe", file=relative,
                                    message=f"path is {problem}"))
        special = _URL_SPECIAL.search(relative)
        if special:
            raise PathError(Finding(
                code="path-unsafe", file=relative,
                message=f"path has {special.group()!r}, which object-storage URLs give a "
                "meaning (SPEC 2.4 rule 1: no %, ?, # or control characters)"))
        return f"{self.prefix}/{relative}"

    # --- metadata -------------------------------------------------------------------------

    def version(self, relative: str) -> ObjectVersion:
        """The object's size and version now (never a cached answer)."""
        key = self.key(relative)
        info = self._call(relative, None, lambda: self._fresh_info(key))
        with self._traffic_lock:
            self.traffic.stats += 1
        if info.get("type") not in (None, "file"):
            raise PathError(Finding(code="file-not-regular", file=relative,
                                    message=f"{self.url_of(relative)} is not an object"))
        size = info.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise StorageError(Finding(
                code="storage-failed", file=relative,
                message=f"the store reports no size for {self.url_of(relative)} "
                f"({size!r}): its length cannot be checked (SPEC 9.1)"))
        tag = tuple((name, str(info[name])) for name in _VERSION_FIELDS
                    if info.get(name) not in (None, ""))
        return ObjectVersion(size, tag)

    def _fresh_info(self, key: str) -> dict[str, Any]:
        self.fs.invalidate_cache(key)
        return dict(self.fs.info(key))

    def check_unchanged(self, relative: str, before: ObjectVersion) -> None:
        """IntegrityError ``object-changed`` if the object is not the one read."""
        after = self.version(relative)
        if after != before:
            raise IntegrityError(Finding(
                code="object-changed", file=relative,
                message=f"{self.url_of(relative)} changed while it was read "
                f"({describe_version(before)} before, {describe_version(after)} after)",
                hint="nobody may replace an object a manifest lists (SPEC 10.2); load again "
                "once the writer has committed"))

    # --- reads ----------------------------------------------------------------------------

    def read(self, relative: str, start: int, end: int,
             check: Callable[[ObjectVersion], None] | None = None) -> bytes:
        """Bytes ``start..end`` of the object, exactly: a short answer is retried like any
        transient failure. ``check`` sees the size and version the store reports with the
        answer, where it reports them (S3), before the body is read."""
        want = end - start
        if want <= 0:
            return b""

        def once() -> bytes:
            data = self._get(relative, start, end, None, check)
            if len(data) != want:
                raise _ShortRead(f"the storage sent {len(data)} of {want} bytes (the object is "
                                 "shorter than its record, or the connection broke)")
            return data

        return self._call(relative, (start, end), once)

    def read_whole(self, relative: str, limit: int,
                   check: Callable[[ObjectVersion], None] | None = None) -> bytes:
        """The object's bytes with one request (on S3 a GET without ``Range``), or its first
        ``limit`` bytes when it is longer (the caller refuses it then): one request is one
        version of the object. ``check`` as for :meth:`read`."""
        return self._call(relative, None, lambda: self._get(relative, 0, None, limit, check))

    def read_into(self, relative: str, start: int, view: memoryview, whole: bool = False,
                  check: Callable[[ObjectVersion], None] | None = None,
                  cut: Cut | None = None) -> int:
        """Bytes ``start..start+len(view)`` of the object into ``view`` with one request
        (``whole``: the object, exactly that long, asked without a range); returns how many
        were kept. ``check`` as for :meth:`read`; a short answer is retried.

        On S3 the body goes straight into ``view`` as it arrives, and ``cut`` (told the bytes
        in, the seconds to the first byte and so far, once ``DATA_SAMPLE_BYTES`` are in) may
        keep fewer: the caller asks for the rest. Elsewhere the answer is copied in whole and
        ``cut`` is not asked."""
        if not self.answers_carry_versions:
            view[:] = self.read(relative, start, start + len(view), check)
            return len(view)
        key = self.key(relative)
        kept = len(view)

        def agree(reported: Reported) -> None:
            if check is not None:
                check(ObjectVersion(*reported))

        def measured(got: int, first_byte: float, seconds: float) -> int:
            nonlocal cut, kept
            assert cut is not None
            kept, cut = min(kept, cut(got, first_byte, seconds)), None  # once, retries too
            return kept

        def once() -> int:
            asked = view[:kept]  # a retry after the cut asks for what the stream kept
            sample = min(remote_link.DATA_SAMPLE_BYTES, len(asked))
            _, first_byte, got, seconds = s3_read_into(
                self.fs, key, start, whole and kept == len(view), asked, agree,
                None if cut is None else measured, sample)
            if got < kept:
                raise _ShortRead(f"the storage sent {got} of {kept} bytes (the object is "
                                 "shorter than its record, or the connection broke)")
            self._answered(seconds, got, first_byte)
            return got

        return self._call(relative, None if whole else (start, start + len(view)), once)

    def _get(self, relative: str, start: int, end: int | None, limit: int | None,
             check: Callable[[ObjectVersion], None] | None) -> bytes:
        """One GET (``end`` None: the whole object, at most ``limit`` bytes), timed for the
        link and counted."""
        key = self.key(relative)
        started = time.perf_counter()
        first_byte: float | None = None
        if self.answers_carry_versions:
            def agree(reported: Reported) -> None:
                if check is not None:
                    check(ObjectVersion(*reported))

            data, _, first_byte = s3_get(self.fs, key, start, end, limit, agree)
        else:
            stop = end if end is not None else start + (limit or 0)
            data = bytes(self.fs.cat_file(key, start=start, end=stop))
        self._answered(time.perf_counter() - started, len(data), first_byte)
        return data

    def _answered(self, seconds: float, nbytes: int, first_byte_s: float | None) -> None:
        """One GET answered: the link learns from it, and the traffic counts it."""
        self.link.observe(seconds, nbytes, first_byte_s)
        with self._traffic_lock:
            self.traffic.reads += 1
            self.traffic.bytes_read += nbytes

    def map(self, work: Callable[[T], None], items: Sequence[T]) -> None:
        """``work`` on every item, :data:`REQUESTS_IN_FLIGHT` at once; the first error raised."""
        if len(items) <= 1:
            for item in items:
                work(item)
            return
        wait_all([self.pool().submit(work, item) for item in items])

    def pool(self) -> ThreadPoolExecutor:
        """The process's pool of request threads, shared by every root: the bound on requests
        in flight. Work in it never submits to it again (no wait on a full pool)."""
        global _POOL
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(REQUESTS_IN_FLIGHT,
                                           thread_name_prefix="shardspec-remote")
            return _POOL

    # --- writes (SPEC 10.4) -----------------------------------------------------------------

    def put_file(self, relative: str, source: str) -> None:
        """Upload the local file ``source`` as the object ``relative`` (whole, or not at all:
        an object store never shows a partial upload, so a failed upload is simply retried)."""
        key = self.key(relative)
        self._call(relative, None, lambda: self.fs.put_file(source, key))

    def put_bytes(self, relative: str, data: bytes) -> None:
        key = self.key(relative)
        self._call(relative, None, lambda: self.fs.pipe_file(key, data))

    def remove(self, relative: str) -> None:
        """Delete the object if it exists."""
        key = self.key(relative)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(key)

        self._call(relative, None, remove)

    def names(self) -> list[str]:
        """Relative names of the objects under the prefix (for a writer's clean-up only: a
        reader never lists, SPEC 2.4)."""
        def find() -> list[str]:
            try:
                return list(self.fs.find(self.prefix))
            except FileNotFoundError:
                return []

        found = self._call(".", None, find)
        start = len(self.prefix) + 1
        return sorted(name[start:] for name in found if name.startswith(self.prefix + "/"))

    # --- errors and retries -----------------------------------------------------------------

    def _call(self, relative: str, byte_range: tuple[int, int] | None,
              attempt: Callable[[], T]) -> T:
        """Run ``attempt``, retrying what may pass on another try (a 5xx, throttling, a dropped
        connection, a short body); missing objects and refused credentials are not retried.
        Every storage failure becomes a finding naming the object."""
        where = self.url_of(relative) if relative != "." else self.url
        if byte_range is not None:
            where += f" bytes {byte_range[0]}..{byte_range[1]}"
        tries = RETRIES
        for number in range(1, tries + 1):
            try:
                return attempt()
            except (ShardspecError, Cancelled, *_BUGS):
                raise
            except FileNotFoundError:
                raise PathError(Finding(code="file-missing", file=relative,
                                        message=f"{where} does not exist")) from None
            except PermissionError as exc:
                raise StorageError(Finding(
                    code="storage-denied", file=relative,
                    message=f"the storage refused access to {where}: {_reason(exc)}",
                    hint="check the credentials and permissions (fsspec storage_options, or "
                    "FSSPEC_<PROTOCOL> settings in the environment)")) from None
            except RangeNotSatisfiable:
                raise IntegrityError(Finding(
                    code="file-size", file=relative,
                    message=f"{where}: the store answered 416 (range not satisfiable), so the "
                    "object is shorter than its record",
                    hint="the object is truncated, replaced or still uploading")) from None
            except (IsADirectoryError, NotADirectoryError):
                raise PathError(Finding(code="file-not-regular", file=relative,
                                        message=f"{where} is not an object")) from None
            except Exception as exc:  # noqa: BLE001 - client libraries raise their own types
                if _is_credentials_problem(exc):
                    raise StorageError(Finding(
                        code="storage-denied", file=relative,
                        message=f"no usable credentials for {where}: {_reason(exc)}",
                        hint="give credentials (fsspec storage_options, the environment, or "
                        "the store's config files), or anon=True for a public bucket")
                    ) from None
                if not _is_transient(exc) or number == tries:
                    attempts = f" after {number} attempts" if number > 1 else ""
                    raise StorageError(Finding(
                        code="storage-failed", file=relative,
                        message=f"reading or writing {where} failed{attempts}: "
                        f"{type(exc).__name__}: {_reason(exc)}")) from None
            time.sleep(RETRY_WAIT * 2 ** (number - 1))
        raise AssertionError("unreachable")



class _ShortRead(Exception):
    """The storage answered a ranged request with fewer bytes than asked."""


class Cancelled(Exception):
    """A request not sent because the operation it belonged to had already failed."""


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_credentials_problem(exc: BaseException) -> bool:
    return any(type(e).__name__ in _CREDENTIAL_ERRORS for e in _causes(exc))


def _is_transient(exc: BaseException) -> bool:
    """The store's or the network's failure (a 5xx, throttling, a broken connection, a short
    body), which another try may not meet; not a request the client refused to make."""
    if isinstance(exc, (_ShortRead, OSError, TimeoutError)):
        return True
    return any(type(e).__module__.split(".")[0] in _CLIENT_MODULES
               and not isinstance(e, ValueError) for e in _causes(exc))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "…"


def describe_version(version: ObjectVersion) -> str:
    """An object's size and version fields, for messages."""
    tag = ", ".join(f"{name} {value}" for name, value in version.tag)
    return f"{version.size} bytes" + (f", {tag}" if tag else "")
