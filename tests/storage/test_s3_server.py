"""Self-test of tests/helpers/s3_server.py: the local S3 server, its log, faults and credentials
check.

It also pins down what s3fs raises for each fault (the table in s3_server's docstring).
"""

from __future__ import annotations

import errno
import http.client
import socket
import threading
import time
from typing import TYPE_CHECKING

import aiohttp
import fsspec
import pytest
from botocore.exceptions import ClientError
from fsspec.spec import AbstractFileSystem

if TYPE_CHECKING:  # imported by pytest_plugins (for assertion rewriting) before any test runs
    from s3_server import Request, S3Server

# The fixtures s3_server and s3_bucket. A no-op once tests/conftest.py names the plugin too.
pytest_plugins = ["s3_server"]

DATA = bytes(range(256)) * 4  # 1 KiB


def filesystem(server: S3Server, **overrides: object) -> AbstractFileSystem:
    return fsspec.filesystem("s3", **server.storage_options(**overrides))


def error_code(error: BaseException) -> str:
    """The S3 error code behind an exception s3fs translated from botocore's ClientError."""
    cause = error.__cause__
    assert isinstance(cause, ClientError), repr(error)
    return str(cause.response["Error"]["Code"])


def test_write_read_and_byte_accounting(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/dir/obj.bin"
    fs.pipe(path, DATA)
    assert fs.ls("", detail=False) == [s3_bucket]  # no bucket left over from other tests
    s3_server.clear_log()

    assert fs.cat_file(path) == DATA
    assert s3_server.bytes_requested() == len(DATA)
    s3_server.clear_log()

    assert fs.cat_file(path, start=100, end=300) == DATA[100:300]
    assert fs.cat_file(path, start=1000, end=5000) == DATA[1000:]  # clipped to the object
    [first, second] = s3_server.requests("GET")
    assert (first.key, first.range, first.status) == ("dir/obj.bin", "bytes=100-299", 206)
    assert second.range == "bytes=1000-4999"
    assert s3_server.bytes_requested("dir/") == 200 + 24 == s3_server.bytes_sent()
    assert s3_server.bytes_requested("other/") == 0
    assert all(r.access_key == s3_server.access_key for r in s3_server.requests())


def test_missing_key_is_file_not_found(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{s3_bucket}/missing")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{s3_bucket}/missing", start=0, end=10)
    with pytest.raises(FileNotFoundError):
        fs.open(f"{s3_bucket}/missing", "rb")


def test_error_rule_fires_exactly_its_count(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/obj"
    fs.pipe(path, DATA)
    rule = s3_server.fail("GET", "ob*", times=2)  # 500 InternalError
    for _ in range(2):
        with pytest.raises(OSError) as caught:  # s3fs does not retry a 500
            fs.cat_file(path, start=0, end=10)
        assert caught.value.errno == errno.EREMOTEIO
        assert error_code(caught.value) == "InternalError"
    assert fs.cat_file(path, start=0, end=10) == DATA[:10]
    assert rule.fired == 2
    assert [r.status for r in s3_server.requests("GET")] == [500, 500, 206]
    assert [r.fault for r in s3_server.requests("GET")] == ["error", "error", None]


def test_slow_down_is_retried_by_s3fs(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/obj"
    fs.pipe(path, DATA)
    s3_server.fail("GET", lambda key: key == "obj", status=503, code="SlowDown", times=2)
    assert fs.cat_file(path, start=0, end=10) == DATA[:10]
    assert [r.status for r in s3_server.requests("GET")] == [503, 503, 206]


def test_truncated_body(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/obj"
    fs.pipe(path, DATA)
    s3_server.clear_log()

    s3_server.truncate("GET", "obj", after_bytes=10)  # once: s3fs retries, the caller sees nothing
    assert fs.cat_file(path, start=0, end=100) == DATA[:100]
    gets = s3_server.requests("GET")
    assert [(r.status, r.body_length, r.bytes_sent, r.fault) for r in gets] == [
        (206, 100, 10, "truncate"), (206, 100, 100, None)]
    assert s3_server.bytes_requested() == 200 and s3_server.bytes_sent() == 110
    s3_server.clear_log()

    s3_server.truncate("GET", "obj", after_bytes=10, times=None)  # always: s3fs gives up
    with pytest.raises(aiohttp.ClientPayloadError, match="Not enough data"):
        fs.cat_file(path, start=0, end=100)
    assert len(s3_server.requests("GET")) == 5  # S3FileSystem.retries


def test_a_paced_body_arrives_whole_at_its_rate(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/obj"
    data = bytes(range(256)) * 1024  # 256 KiB
    fs.pipe(path, data)
    s3_server.clear_log()
    s3_server.pace("GET", "obj", 1e6)
    started = time.perf_counter()
    assert fs.cat_file(path) == data
    assert time.perf_counter() - started >= 0.24  # 15 pieces after the first, at 1 MB/s
    assert [r.fault for r in s3_server.requests("GET")] == ["pace"]


def test_wrong_access_key_is_permission_error(s3_server: S3Server, s3_bucket: str) -> None:
    filesystem(s3_server).pipe(f"{s3_bucket}/obj", DATA)
    fs = filesystem(s3_server, key="AKIAWRONG")
    with pytest.raises(PermissionError) as caught:  # GET: S3's XML error
        fs.cat_file(f"{s3_bucket}/obj", start=0, end=10)
    assert error_code(caught.value) == "InvalidAccessKeyId"
    with pytest.raises(PermissionError):  # HEAD: a bare 403
        fs.info(f"{s3_bucket}/obj")
    assert {(r.status, r.access_key) for r in s3_server.requests(key_prefix="obj")} == {
        (200, "testing"), (403, "AKIAWRONG")}


def test_unsigned_request_is_access_denied(s3_server: S3Server, s3_bucket: str) -> None:
    filesystem(s3_server).pipe(f"{s3_bucket}/obj", DATA)
    with pytest.raises(PermissionError) as caught:
        filesystem(s3_server, anon=True).cat_file(f"{s3_bucket}/obj", start=0, end=10)
    assert error_code(caught.value) == "AccessDenied"


def test_hook_overwrites_the_object_between_ranged_reads(
        s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/obj"
    fs.pipe(path, DATA)
    seen: list[Request] = []

    def overwrite(request: Request) -> None:
        seen.append(request)
        s3_server.put_object(s3_bucket, "obj", b"new contents")

    rule = s3_server.on_request("GET", "obj", overwrite)
    with fs.open(path, "rb", cache_type="none") as f:  # each read is one ranged GET, If-Match'ed
        assert f.read(10) == DATA[:10]  # served before the hook changed the object
        with pytest.raises(OSError) as caught:
            f.read(10)
    assert type(caught.value).__name__ == "FileExpired" and caught.value.errno == errno.EBUSY
    assert rule.fired == 1 and [r.range for r in seen] == ["bytes=0-9"]
    assert s3_server.requests("GET")[-1].status == 412
    assert fs.cat_file(path, start=0, end=3) == b"new"  # no If-Match: the new object


def test_injected_precondition_failure(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    path = f"{s3_bucket}/obj"
    fs.pipe(path, DATA)
    s3_server.fail("GET", "obj", status=412, code="PreconditionFailed", times=2)
    with fs.open(path, "rb", cache_type="none") as f, pytest.raises(OSError) as expired:
        f.read(10)
    assert type(expired.value).__name__ == "FileExpired"
    with pytest.raises(OSError) as caught:
        fs.cat_file(path, start=0, end=10)
    assert caught.value.errno == errno.EINVAL and error_code(caught.value) == "PreconditionFailed"


def test_failing_hook_is_a_500_and_is_raised_again(s3_server: S3Server, s3_bucket: str) -> None:
    fs = filesystem(s3_server)
    fs.pipe(f"{s3_bucket}/obj", DATA)
    s3_server.on_request(None, "*", lambda request: 1 / 0, times=None)
    with pytest.raises(OSError) as caught:
        fs.cat_file(f"{s3_bucket}/obj", start=0, end=10)
    assert caught.value.errno == errno.EREMOTEIO
    with pytest.raises(RuntimeError, match="hook") as raised:
        s3_server.raise_hook_errors()
    assert isinstance(raised.value.__cause__, ZeroDivisionError)
    s3_server.reset()  # or s3_bucket's teardown raises it once more


def test_clean_shutdown_frees_thread_and_port() -> None:
    from s3_server import S3Server

    before = set(threading.enumerate())
    with S3Server() as server:
        port = server.port
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/some-bucket/key")  # unsigned
        response = connection.getresponse()
        assert response.status == 403 and b"<Code>AccessDenied</Code>" in response.read()
        connection.close()
    assert set(threading.enumerate()) <= before
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
