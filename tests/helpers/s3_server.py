"""A real S3-protocol server on 127.0.0.1 for object-storage tests, with faults on demand.

Moto's S3 backend runs in server mode (its WSGI app, served by werkzeug's threaded server in a
background thread on an OS-chosen port), behind a small WSGI middleware that

- logs every request: method, bucket, key, Range header, status, body bytes
  (:meth:`S3Server.requests`, :meth:`S3Server.bytes_requested`, :meth:`S3Server.clear_log`);
- injects faults by rule, each matching a method and a key (a glob, or a predicate on the key)
  and firing a given number of times: an S3 XML error in place of moto's answer
  (:meth:`S3Server.fail`), a body cut short after N bytes while the headers, Content-Length
  included, are moto's (:meth:`S3Server.truncate`), a body sent at a given rate, as a slow
  network carries it (:meth:`S3Server.pace`), or a hook run once moto has answered
  (:meth:`S3Server.on_request`);
- accepts one access key id only: a request signed with another gets S3's 403
  ``InvalidAccessKeyId``, an unsigned one 403 ``AccessDenied`` (signatures are not verified,
  only the key id is).

The fixtures: ``s3_server`` (session scope, an :class:`S3Server`) and ``s3_bucket`` (a fresh
bucket's name per test; afterwards moto's state, the rules and the log are reset, and an
exception a hook raised is raised again)::

    def test_read(s3_server: S3Server, s3_bucket: str) -> None:
        fs = fsspec.filesystem("s3", **s3_server.storage_options())
        fs.pipe(f"{s3_bucket}/a", b"0123456789")
        assert fs.cat_file(f"{s3_bucket}/a", start=2, end=5) == b"234"
        assert s3_server.bytes_requested("a") == 3

What s3fs 2026.9 (aiobotocore 3.10, aiohttp 3.14) raises for each fault, with
``storage_options()``; tests/storage/test_s3_server.py checks each one. botocore never retries there
(``retries={"total_max_attempts": 1}``: botocore's ``max_attempts`` counts *retries*, so
``max_attempts: 1`` would send every request twice). s3fs retries on its own, though:
``S3FileSystem.retries`` (5, a class attribute and not an option; ``fs.retries = 1`` on an
instance works) tries in all for a "retryable" error, sleeping 0.1 s * 1.7**i after try i
(about 1.9 s for 5 tries).

- missing key: ``FileNotFoundError``, from ``cat_file`` (whole or ranged) and ``open``.
- 500 ``InternalError``: not retried by s3fs; ``OSError`` with ``errno == EREMOTEIO`` (121),
  from the first failure, so ``fail(..., times=1)`` is enough. Likewise any code s3fs does not
  retry (``__cause__`` is botocore's ``ClientError``, with the code in ``.response``).
- 503 ``SlowDown``: retried by s3fs (it looks for "SlowDown" in the error): fewer than 5
  failures in a row are invisible to the caller; 5 raise ``OSError``, ``errno == EBUSY`` (16).
- truncated body: aiohttp's ``ClientPayloadError`` ("Response payload is not completed ...
  Not enough data to satisfy content length header"), which s3fs retries: fewer than 5
  truncations in a row are invisible (the right bytes come back, the log shows the extra
  GETs); 5 raise ``aiohttp.ClientPayloadError`` itself, which is *not* an ``OSError``, from
  ``cat_file`` and from reads of ``fs.open(...)`` files alike. s3fs never returns short data.
- wrong access key id: ``PermissionError`` (GET: from ``InvalidAccessKeyId``; HEAD, as in
  ``info`` and whole-object ``cat_file``: from the bare 403). Unsigned (``anon=True``):
  ``PermissionError`` too (``AccessDenied``).
- precondition: a file from ``fs.open(path, "rb")`` sends ``If-Match: <ETag at open>`` with
  each ranged GET. When the object changed since (e.g. a hook's :meth:`S3Server.put_object`),
  moto answers 412 ``PreconditionFailed`` and s3fs raises ``s3fs.utils.FileExpired`` (an
  ``OSError``, ``errno == EBUSY``); so does an injected
  ``fail("GET", key, status=412, code="PreconditionFailed")`` (s3fs looks for "pre-conditions"
  in the message). ``cat_file(path, start, end)`` sends no If-Match: it reads the new object,
  and an injected 412 gives a plain ``OSError``, ``errno == EINVAL`` (22).
"""

from __future__ import annotations

import fnmatch
import functools
import http.client
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import pytest

if TYPE_CHECKING:
    from moto.s3.models import S3Backend
    from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

# moto (0.3 s to import) is imported when a server starts: tests/conftest.py loads this module
# as a plugin for every run.

REGION = "us-east-1"
DEFAULT_ACCESS_KEY = "testing"
DEFAULT_SECRET_KEY = "testing"

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
KeyMatch = str | Callable[[str], bool]


@dataclass(frozen=True)
class Request:
    """One request as the server saw and answered it."""

    method: str
    bucket: str  # "" for service-level requests (ListBuckets)
    key: str  # "" for bucket-level requests (ListObjectsV2, CreateBucket, ...)
    range: str | None  # the Range header, verbatim
    status: int
    body_length: int  # bytes of the body moto produced (or of the injected error)
    bytes_sent: int  # bytes of the body that went out: 0 for HEAD, fewer when truncated
    access_key: str | None  # the key id the request was signed with; None when unsigned
    fault: str | None = None  # "error", "truncate" or "pace" when a rule changed the answer


#: Messages S3 sends with these codes (s3fs matches some: "SlowDown", "pre-conditions").
MESSAGES = {
    "AccessDenied": "Access Denied",
    "InternalError": "We encountered an internal error. Please try again.",
    "InvalidAccessKeyId": "The AWS Access Key Id you provided does not exist in our records.",
    "NoSuchKey": "The specified key does not exist.",
    "PreconditionFailed": "At least one of the pre-conditions you specified did not hold",
    "ServiceUnavailable": "Service is unable to handle request.",
    "SlowDown": "Please reduce your request rate.",
}


@dataclass
class Rule:
    """A fault or a hook for requests matching ``method`` (None: any) and ``key``.

    ``key`` is a glob (``fnmatch``, case-sensitive; ``"*"`` also matches the empty key of
    bucket-level requests) or a predicate on the key. The rule fires ``times`` times (None:
    on every match); ``fired`` counts how often it did.
    """

    action: Literal["error", "truncate", "pace", "hook"]
    method: str | None
    key: KeyMatch
    times: int | None = 1
    status: int = 500
    code: str = "InternalError"
    message: str | None = None  # None: MESSAGES[code]
    after_bytes: int = 0
    bytes_per_second: float = 0.0
    hook: Callable[[Request], object] | None = None
    fired: int = 0

    def matches(self, method: str, key: str) -> bool:
        if self.times is not None and self.fired >= self.times:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        return self.key(key) if callable(self.key) else fnmatch.fnmatchcase(key, self.key)


Answer = tuple[str, list[tuple[str, str]], bytes]  # status line, headers, body


def error_answer(status: int, code: str, message: str | None, resource: str,
                 **extra: str) -> Answer:
    """An S3 error: status, headers and the XML error document."""
    fields = {"Code": code, "Message": message or MESSAGES.get(code, code),
              "Resource": resource, **extra, "RequestId": uuid.uuid4().hex[:16].upper()}
    inner = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in fields.items())
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error>{inner}</Error>'.encode()
    headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
    return f"{status} {http.client.responses.get(status, 'Error')}", headers, body


def signing_key_id(environ: Environ) -> str | None:
    """The access key id a request is signed with (SigV4 or SigV2, header or query string)."""
    auth: str = environ.get("HTTP_AUTHORIZATION", "")
    if auth.startswith("AWS4-"):  # AWS4-HMAC-SHA256 Credential=KEY/date/region/s3/..., ...
        return auth.partition("Credential=")[2].split("/", 1)[0].strip()
    if auth.startswith("AWS "):  # SigV2: AWS KEY:signature
        return auth[4:].rpartition(":")[0]
    query: dict[str, list[str]] = parse_qs(environ.get("QUERY_STRING", ""))
    if "X-Amz-Credential" in query:  # presigned SigV4 URL
        return query["X-Amz-Credential"][0].split("/", 1)[0]
    if "AWSAccessKeyId" in query:  # presigned SigV2 URL
        return query["AWSAccessKeyId"][0]
    return None


def bucket_and_key(environ: Environ) -> tuple[str, str]:
    """The bucket and key of a path-style request (werkzeug gives PATH_INFO as WSGI latin-1)."""
    path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
    bucket, _, key = path.lstrip("/").partition("/")
    return bucket, key


class FaultMiddleware:
    """The WSGI middleware: credentials check, fault rules, hooks and the request log."""

    def __init__(self, app: WSGIApp, access_key: str, allow_anonymous: bool = False) -> None:
        self.app = app
        self.access_key = access_key
        self.allow_anonymous = allow_anonymous
        self.rules: list[Rule] = []
        self.log: list[Request] = []
        self.hook_errors: list[Exception] = []
        self.lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return self.app(environ, start_response)  # moto's own API: not S3, not logged

        method = environ["REQUEST_METHOD"]
        bucket, key = bucket_and_key(environ)
        access_key = signing_key_id(environ)
        resource = f"/{bucket}/{key}" if key else f"/{bucket}"
        fault: Rule | None = None
        hooks: list[Rule] = []
        if access_key is None and not self.allow_anonymous:
            answer = error_answer(403, "AccessDenied", None, resource)
        elif access_key is not None and access_key != self.access_key:
            answer = error_answer(403, "InvalidAccessKeyId", None, resource,
                                  AWSAccessKeyId=access_key)
        else:
            fault, hooks = self._take_rules(method, key)
            if fault is not None and fault.action == "error":
                answer = error_answer(fault.status, fault.code, fault.message, resource)
            else:
                answer = self._forward(environ)

        status, headers, body = answer
        sent = b"" if method == "HEAD" else body
        if fault is not None and fault.action == "truncate":
            sent = sent[: fault.after_bytes]
        record = Request(method, bucket, key, environ.get("HTTP_RANGE"),
                         int(status.split(None, 1)[0]), len(body), len(sent), access_key,
                         fault.action if fault is not None else None)
        with self.lock:
            self.log.append(record)
        for rule in hooks:  # before the answer goes out, so the client cannot race a hook
            assert rule.hook is not None
            try:
                rule.hook(record)
            except Exception as error:  # the test fails in s3_bucket's teardown
                with self.lock:
                    self.hook_errors.append(error)
                status, headers, sent = error_answer(500, "InternalError", repr(error), resource)
                break
        start_response(status, headers)
        if fault is not None and fault.action == "pace":
            return paced(sent, fault.bytes_per_second)
        return [sent]

    def _take_rules(self, method: str, key: str) -> tuple[Rule | None, list[Rule]]:
        """The first matching fault rule and every matching hook, each counted as fired."""
        with self.lock:
            matching = [rule for rule in self.rules if rule.matches(method, key)]
            fault = next((rule for rule in matching if rule.action != "hook"), None)
            hooks = [rule for rule in matching if rule.action == "hook"]
            for rule in [fault, *hooks] if fault is not None else hooks:
                rule.fired += 1
        return fault, hooks

    def _forward(self, environ: Environ) -> Answer:
        """Moto's answer, its body read whole."""
        captured: list[Any] = []
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured[:] = [status, headers]
            return chunks.append

        result = self.app(environ, capture)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = captured
        # werkzeug sends its own Server and Date; a second Server header fails aiohttp's parser
        headers = [(name, value) for name, value in headers
                   if name.lower() not in ("server", "date")]
        return status, headers, b"".join(chunks)


def paced(body: bytes, bytes_per_second: float) -> Iterator[bytes]:
    """``body`` in pieces, each sent when the rate allows."""
    piece = 16 * 1024
    started = time.perf_counter()
    for at in range(0, len(body), piece):
        wait = started + at / bytes_per_second - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        yield body[at:at + piece]


@functools.cache
def request_handler() -> type[WSGIRequestHandler]:
    """Moto's request handler, without werkzeug's line on stderr for every request."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class QuietRequestHandler(MotoRequestHandler):
        timeout = 10  # seconds a connection may sit idle: shutdown never waits longer

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    return QuietRequestHandler


def moto_s3() -> S3Backend:
    """Moto's S3 backend for the default account (the one every access key maps to)."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


class S3Server:
    """Moto's S3 in a background thread on 127.0.0.1, behind :class:`FaultMiddleware`.

    Moto's state is process-wide: run one server at a time, and :meth:`reset` between tests.
    """

    def __init__(self, access_key: str = DEFAULT_ACCESS_KEY,
                 secret_key: str = DEFAULT_SECRET_KEY, *, allow_anonymous: bool = False) -> None:
        self.access_key = access_key
        self.secret_key = secret_key
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        self.middleware = FaultMiddleware(
            DomainDispatcherApplication(create_backend_app), access_key, allow_anonymous)
        self._server: ThreadedWSGIServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> S3Server:
        from werkzeug.serving import ThreadedWSGIServer, make_server

        server = make_server("127.0.0.1", 0, self.middleware, threaded=True,
                             request_handler=request_handler())
        assert isinstance(server, ThreadedWSGIServer)
        server.daemon_threads = False  # so that server_close() joins the request threads
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="s3-server",
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, join the server's threads and close its socket (the port is free)."""
        if self._server is None:
            return
        self._server.shutdown()
        assert self._thread is not None
        self._thread.join()
        self._server.server_close()
        self._server = self._thread = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "the server is not running"
        return self._server.server_port

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, **overrides: Any) -> dict[str, Any]:
        """Options for ``fsspec.filesystem("s3", **options)`` (and shardspec's storage_options);
        ``overrides`` replace top-level entries (``key="other"``, ``anon=True``, ...)."""
        options: dict[str, Any] = {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
            # botocore's max_attempts counts retries; total_max_attempts counts all tries
            "config_kwargs": {"retries": {"total_max_attempts": 1},
                              "s3": {"addressing_style": "path"}},
            "skip_instance_cache": True,
        }
        options.update(overrides)
        return options

    def reset(self) -> None:
        """Forget all buckets (moto's reset API), the fault rules, the log and hook errors."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("POST", "/moto-api/reset")
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
        finally:
            connection.close()
        self.clear_rules()
        self.clear_log()
        with self.middleware.lock:
            self.middleware.hook_errors.clear()

    def raise_hook_errors(self) -> None:
        """Raise the first exception a hook raised (its request got a 500), if any did."""
        with self.middleware.lock:
            errors = list(self.middleware.hook_errors)
        if errors:
            raise RuntimeError(f"{len(errors)} S3Server hook(s) failed") from errors[0]

    # --- the request log -----------------------------------------------------------------

    def requests(self, method: str | None = None, key_prefix: str | None = None) -> list[Request]:
        """Logged requests, oldest first, optionally of one method and under a key prefix."""
        with self.middleware.lock:
            log = list(self.middleware.log)
        return [r for r in log
                if (method is None or r.method == method.upper())
                and (key_prefix is None or r.key.startswith(key_prefix))]

    def bytes_requested(self, key_prefix: str | None = None) -> int:
        """Body bytes of the successful object GETs (a ranged GET: its range, clipped to the
        object; a full GET: the object). Injected errors count 0; a truncated GET counts
        what moto would have sent (see :meth:`bytes_sent`)."""
        return sum(r.body_length for r in self.requests("GET", key_prefix)
                   if r.key and 200 <= r.status < 300)

    def bytes_sent(self, key_prefix: str | None = None) -> int:
        """Body bytes of object GETs that actually went out, errors and truncations included."""
        return sum(r.bytes_sent for r in self.requests("GET", key_prefix) if r.key)

    def clear_log(self) -> None:
        with self.middleware.lock:
            self.middleware.log.clear()

    # --- faults --------------------------------------------------------------------------

    def _add(self, rule: Rule) -> Rule:
        with self.middleware.lock:
            self.middleware.rules.append(rule)
        return rule

    def fail(self, method: str | None, key: KeyMatch, *, status: int = 500,
             code: str = "InternalError", message: str | None = None,
             times: int | None = 1) -> Rule:
        """Answer ``times`` matching requests with an S3 XML error instead of moto's answer.

        Only the first matching error or truncation rule fires for a request."""
        return self._add(Rule("error", method, key, times, status=status, code=code,
                              message=message))

    def truncate(self, method: str | None, key: KeyMatch, *, after_bytes: int = 0,
                 times: int | None = 1) -> Rule:
        """Send moto's status and headers (Content-Length too) but only ``after_bytes`` bytes
        of the body, then close the connection: a connection dropped mid-body."""
        return self._add(Rule("truncate", method, key, times, after_bytes=after_bytes))

    def pace(self, method: str | None, key: KeyMatch, bytes_per_second: float, *,
             times: int | None = None) -> Rule:
        """Send the body of matching answers at ``bytes_per_second``, in 16 KiB pieces: one
        connection of a slower network. A client may close the connection before the end
        (the log's ``bytes_sent`` is still the body's length)."""
        return self._add(Rule("pace", method, key, times, bytes_per_second=bytes_per_second))

    def on_request(self, method: str | None, key: KeyMatch, hook: Callable[[Request], object], *,
                   times: int | None = 1) -> Rule:
        """Call ``hook(request)`` on the server's thread once moto has answered a matching
        request, before the answer is sent (so the client cannot race the hook). The hook may
        change the store, e.g. with :meth:`put_object`."""
        return self._add(Rule("hook", method, key, times, hook=hook))

    def clear_rules(self) -> None:
        with self.middleware.lock:
            self.middleware.rules.clear()

    # --- the store, bypassing the protocol (not logged, no rules) ----------------------------

    def create_bucket(self, name: str) -> None:
        moto_s3().create_bucket(name, REGION)

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        moto_s3().put_object(bucket, key, data)


# --- fixtures ------------------------------------------------------------------------------

#: Environment for the session: test credentials, no AWS config files, no metadata service,
#: no proxy for the local server.
AWS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": DEFAULT_ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": DEFAULT_SECRET_KEY,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
             "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The S3 server for the session, with an AWS environment that reaches nothing else."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in AWS_ENVIRONMENT.items():
            mp.setenv(name, value)
        for name in AWS_UNSET:
            mp.delenv(name, raising=False)
        for name in ("NO_PROXY", "no_proxy"):
            mp.setenv(name, ",".join(filter(None, [os.environ.get(name), "127.0.0.1"])))
        with S3Server() as server:
            server.reset()
            yield server
            server.reset()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[str]:
    """A fresh, empty bucket's name; afterwards hook errors are raised and the server reset.

    Tests that use ``s3_server`` without ``s3_bucket`` should call ``s3_server.reset()``."""
    name = f"shardspec-test-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    yield name
    try:
        s3_server.raise_hook_errors()
    finally:
        s3_server.reset()
