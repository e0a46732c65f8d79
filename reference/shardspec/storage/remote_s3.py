"""GETs of S3 objects that keep what the answer's headers say (SPEC 2.4, 9.1, 9.3).

An S3 GET answers with the object's size (``Content-Range: bytes a-b/SIZE``, or the
``Content-Length`` of a GET without ``Range``) and its ``ETag`` (and ``x-amz-version-id`` where
the bucket keeps versions). So the reader needs no HEAD: it checks the size and the version of
every answer before the answer's body is read. s3fs's ``cat_file`` drops those headers (and sends
a HEAD of its own before a whole-object read), so the GET is made here, with the botocore client
s3fs holds, through its public methods only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["Cut", "RangeNotSatisfiable", "S3Answer", "S3Streamed", "is_s3", "s3_get",
           "s3_read_into"]

#: The size the store reports and the version fields, as in ``ObjectVersion``.
Reported = tuple[int, tuple[tuple[str, str], ...]]

#: (body, what the store reported, seconds to the first byte)
S3Answer = tuple[bytes, Reported, float]

#: (what the store reported, seconds to the first byte, bytes read, seconds in all)
S3Streamed = tuple[Reported, float, int, float]

#: Told (bytes read so far, seconds to the first byte, seconds so far) once, returns how many
#: bytes the stream still keeps in all: fewer than asked ends it early.
Cut = Callable[[int, float, float], int]

#: Bytes taken from an answer's body at a time: the client's buffered part, up to this.
_BODY_READ_BYTES = 4 * 1024 * 1024


class RangeNotSatisfiable(Exception):
    """The store answered 416: the object ends before the range asked begins."""


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs's filesystem (any S3-compatible store)."""
    return type(fs).__module__.split(".")[0] == "s3fs"


def s3_get(fs: Any, path: str, start: int, end: int | None, limit: int | None,
           check: Callable[[Reported], None] | None) -> S3Answer:
    """One GET of ``path``: bytes ``start..end``, or the whole object (``end`` None: no
    ``Range``, at most ``limit`` bytes of its body read). ``check`` sees the reported size and
    version before the body is read, and refuses by raising.

    Made with the botocore client s3fs holds (``set_session``, ``get_s3``: public), with the
    filesystem's ``s3_additional_kwargs`` that GetObject takes (a requester-pays flag, SSE-C
    keys). Failures are s3fs's errors (``translate_boto_error``: FileNotFoundError for a missing
    key, PermissionError for a refusal); retrying is the caller's (``RemoteRoot._call``).
    """
    async def call_and_read() -> S3Answer:
        body, reported, first_byte, _ = await _answer(fs, path, start, end, check)
        try:
            data = await (body.read() if limit is None else _read_at_most(body, limit))
        finally:
            body.close()
        return bytes(data), reported, first_byte

    answer: S3Answer = _run(fs, call_and_read, start)
    return answer


def s3_read_into(fs: Any, path: str, start: int, whole: bool, view: memoryview,
                 check: Callable[[Reported], None] | None, cut: Cut | None = None,
                 cut_after: int = 0) -> S3Streamed:
    """One GET of bytes ``start..start+len(view)`` (``whole``: the object, without ``Range``),
    its body read straight into ``view`` as it arrives. ``check`` as for :func:`s3_get`.

    ``cut``, once ``cut_after`` bytes (or all) are in, may keep fewer than asked: the stream
    stops there and its connection is closed (the caller asks for the rest elsewhere). Fewer
    bytes than kept means the body broke off: the caller retries."""
    async def call_and_stream() -> S3Streamed:
        end = None if whole else start + len(view)
        body, reported, first_byte, started = await _answer(fs, path, start, end, check)
        kept, got, asked = len(view), 0, cut is not None
        try:
            while got < kept:
                part = await body.read(min(kept - got, _BODY_READ_BYTES))
                if not part:
                    break
                view[got:got + len(part)] = part
                got += len(part)
                if asked and (got >= cut_after or got == kept):
                    assert cut is not None
                    asked = False
                    kept = min(kept, cut(got, first_byte, time.perf_counter() - started))
        finally:
            body.close()  # before the end of the body: the connection is dropped, not reused
        return reported, first_byte, got, time.perf_counter() - started

    streamed: S3Streamed = _run(fs, call_and_stream, start)
    return streamed


async def _answer(fs: Any, path: str, start: int, end: int | None,
                  check: Callable[[Reported], None] | None) -> tuple[Any, Reported, float, float]:
    """A GET's body, unread, once ``check`` has accepted what the answer reports; the seconds
    to its first byte; the time it was asked (``perf_counter``)."""
    bucket, key, version_id = fs.split_path(path)
    head: dict[str, str] = {}
    if end is not None:
        head["Range"] = f"bytes={start}-{end - 1}"
    if version_id:
        head["VersionId"] = version_id
    await fs.set_session()
    client = await fs.get_s3(bucket)
    started = time.perf_counter()
    answer = await client.get_object(Bucket=bucket, Key=key,
                                     **_get_object_options(client, fs), **head)
    first_byte = time.perf_counter() - started
    body = answer["Body"]
    try:
        reported = _reported(answer)
        if check is not None:
            check(reported)
    except BaseException:
        body.close()
        raise
    return body, reported, first_byte, started


def _run(fs: Any, call: Callable[[], Any], start: int) -> Any:
    """``call`` on s3fs's event loop; errors as s3fs reports them."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 - with s3fs, only for S3
    from fsspec.asyn import sync  # noqa: PLC0415
    from s3fs.errors import translate_boto_error  # noqa: PLC0415

    try:
        return sync(fs.loop, call)
    except Exception as exc:
        if _status(exc) == 416:
            raise RangeNotSatisfiable(start) from None
        if isinstance(exc, ClientError):  # NoSuchKey, AccessDenied, ...: as s3fs reports them
            raise translate_boto_error(exc) from exc
        raise


def _get_object_options(client: Any, fs: Any) -> dict[str, Any]:
    """The filesystem's ``s3_additional_kwargs`` that GetObject accepts (botocore's model)."""
    extra = getattr(fs, "s3_additional_kwargs", None) or {}
    if not extra:
        return {}
    accepted = client.meta.service_model.operation_model("GetObject").input_shape.members
    return {name: value for name, value in extra.items()
            if name in accepted and value is not None}


async def _read_at_most(body: Any, limit: int) -> bytes:
    """Up to ``limit`` bytes of a streaming body (one ``read(n)`` may return fewer)."""
    parts, count = [], 0
    while count < limit:
        part = await body.read(limit - count)
        if not part:
            break
        parts.append(part)
        count += len(part)
    return b"".join(parts)


def _reported(answer: dict[str, Any]) -> Reported:
    content_range = answer.get("ContentRange") or ""
    if "/" in content_range and not content_range.endswith("/*"):
        size = int(content_range.rsplit("/", 1)[1])
    else:
        size = int(answer.get("ContentLength", -1))
    tag = tuple((name, str(answer[name])) for name in ("VersionId", "ETag")
                if answer.get(name) not in (None, ""))
    return size, tag


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError (or one behind s3fs's translated error)."""
    for error in (exc, exc.__cause__):
        response = getattr(error, "response", None) or {}
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status is None and response.get("Error", {}).get("Code") == "InvalidRange":
            return 416
        if isinstance(status, int):
            return status
    return None
