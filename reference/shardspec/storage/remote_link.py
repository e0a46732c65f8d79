"""How fast a store answers, measured from the requests made, and the request size that follows.

A ranged request costs a round trip and the store's own work before its first byte (the
*latency*), then its bytes at the rate one connection carries (the *throughput*). Requests far
longer than a latency's worth of bytes leave connections idle while the few of them drain;
requests far shorter pay the latency over and over. So a request asks for about
:data:`LATENCIES_PER_REQUEST` latencies' worth of bytes, the latency then being a fifth of its
time, within :data:`MIN_REQUEST_BYTES`..:data:`MAX_REQUEST_BYTES`; an object is cut into the
nearest whole number of such requests.

Both figures are measured per store endpoint (a :class:`Link`, shared by every checkpoint read
from it in the process) from the GETs the reader makes anyway: each answer's time to its first
byte and its body's bytes and time, in exponentially weighted averages whose first sample
replaces the guess made before any (S3's typical 30 ms and 90 MB/s per connection, which give
S3's recommended 8-16 MB ranges). Data requests are sized with the latency of data-sized
answers once one is measured: a store that answers a small object (a manifest) sooner than a
large one would otherwise have its data cut into more requests after every small GET.

Until a data-sized answer has been measured (:attr:`Link.data_measured`), an object of several
requests is measured by its own first GET, and the rest are sized with that object's own
latency where it is longer than the link's: a store whose every request costs in proportion to
the object (one that copies the object per ranged GET) then gets a few large requests instead
of many small ones, and S3, whose latency is the same for any object, the ranges it would have
got. On S3 that GET asks for the whole object, and its first :data:`DATA_SAMPLE_BYTES` give the
latency and throughput that size the rest, which follow in ranged GETs while it goes on to
where they begin (``RemoteObject.read_into``); the link learns from the whole answer.
Elsewhere the first request goes alone, and :meth:`Link.latency_of` takes the latency out of
its time.
"""

from __future__ import annotations

import math
import threading
from typing import Any

__all__ = [
    "DATA_SAMPLE_BYTES",
    "DEFAULT_LATENCY_S",
    "DEFAULT_THROUGHPUT",
    "LATENCIES_PER_REQUEST",
    "MAX_REQUEST_BYTES",
    "MIN_REQUEST_BYTES",
    "REQUEST_BYTES",
    "Link",
    "link_for",
]

#: Seconds to an answer's first byte, before any was measured.
DEFAULT_LATENCY_S = 0.030

#: Bytes per second of one connection, before any was measured.
DEFAULT_THROUGHPUT = 90e6

#: A request asks for this many latencies' worth of bytes.
LATENCIES_PER_REQUEST = 4

#: Bounds of a request's size: below, per-request costs beyond the round trip (signing, the
#: store's per-request charge) dominate; above, one slow connection holds the whole load up.
MIN_REQUEST_BYTES = 8 * 1024 * 1024
MAX_REQUEST_BYTES = 512 * 1024 * 1024

#: A fixed request size in place of the measured one; None: measured. For a store whose cost
#: the measurement misjudges, and for benchmarks (one request per object: ``1 << 40``).
REQUEST_BYTES: int | None = None

#: A body this long or longer is a data request's: the first one measured ends the probing of
#: objects' own latency (see the module's docstring).
DATA_SAMPLE_BYTES = 1024 * 1024

#: Weight of a new sample in the averages.
_WEIGHT = 0.25

#: A body shorter than this says nothing of the throughput: where the client times the first
#: byte, the body's own time is measured (the manifest's GET is the first sample); where it
#: does not, a short body's time is mostly latency.
_THROUGHPUT_SAMPLE_BYTES = 64 * 1024
_UNTIMED_THROUGHPUT_SAMPLE_BYTES = 1024 * 1024


class Link:
    """The latency and throughput of one store endpoint, as measured so far."""

    def __init__(self) -> None:
        self.latency_s = DEFAULT_LATENCY_S
        self.throughput = DEFAULT_THROUGHPUT
        #: samples taken of each: 0 means the figure is still the guess
        self.latency_samples = self.throughput_samples = 0
        #: answers of DATA_SAMPLE_BYTES or more measured
        self.data_samples = 0
        #: the latency of those answers alone, where the client times the first byte: it sizes
        #: data requests (a store may answer a small object sooner than a large one)
        self.data_latency_s = DEFAULT_LATENCY_S
        self.data_latency_samples = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"Link(latency {self.latency_s * 1e3:.1f} ms, "
                f"of data requests {self.request_latency_s * 1e3:.1f} ms, "
                f"{self.throughput / 1e6:.0f} MB/s, requests of "
                f"{self.request_bytes() / 2**20:.1f} MiB)")

    def observe(self, seconds: float, nbytes: int, first_byte_s: float | None = None) -> None:
        """Learn from one answered GET: ``nbytes`` of body in ``seconds`` in all, the first
        after ``first_byte_s`` (None where the client does not tell: then only a short body's
        time counts, as latency)."""
        latency = first_byte_s
        least = _THROUGHPUT_SAMPLE_BYTES
        if latency is None:
            least = _UNTIMED_THROUGHPUT_SAMPLE_BYTES
            if nbytes < least:
                latency = seconds
        with self._lock:
            if latency is not None:
                self.latency_s = _average(self.latency_s, max(latency, 0.0),
                                          self.latency_samples)
                self.latency_samples += 1
            if nbytes >= DATA_SAMPLE_BYTES:
                self.data_samples += 1
                if first_byte_s is not None:
                    self.data_latency_s = _average(self.data_latency_s, max(first_byte_s, 0.0),
                                                   self.data_latency_samples)
                    self.data_latency_samples += 1
            if nbytes >= least:
                transfer = seconds - (first_byte_s if first_byte_s is not None
                                      else self.latency_s)
                rate = nbytes / max(transfer, 1e-4)
                self.throughput = _average(self.throughput, rate, self.throughput_samples)
                self.throughput_samples += 1

    @property
    def data_measured(self) -> bool:
        """Whether an answer as long as a data request's has been measured (or the size is
        fixed): until then, an object's own latency is worth a request of its own."""
        return REQUEST_BYTES is not None or self.data_samples > 0

    @property
    def request_latency_s(self) -> float:
        """The latency that sizes a data request: that of data-sized answers once one is
        measured, else that of any answer."""
        return self.data_latency_s if self.data_latency_samples else self.latency_s

    def latency_of(self, seconds: float, nbytes: int) -> float:
        """The latency one answer of ``nbytes`` in ``seconds`` shows: its time less its bytes
        at the measured throughput."""
        return max(seconds - nbytes / self.throughput, 0.0)

    def request_bytes(self, latency_s: float | None = None,
                      throughput: float | None = None) -> int:
        """The size of one ranged request now; ``latency_s``: an object's own latency, where
        it is longer than the link's; ``throughput``: one measured in place of the link's."""
        if REQUEST_BYTES is not None:
            return REQUEST_BYTES
        latency = max(self.request_latency_s, latency_s or 0.0)
        wanted = LATENCIES_PER_REQUEST * latency * (throughput or self.throughput)
        return int(min(max(wanted, MIN_REQUEST_BYTES), MAX_REQUEST_BYTES))

    def ranges(self, start: int, end: int, latency_s: float | None = None,
               throughput: float | None = None) -> list[tuple[int, int]]:
        """``start..end`` in requests of even sizes (no short last request paying a whole
        latency for a few bytes): the whole number of them nearest to :meth:`request_bytes`
        each, a measured balance rather than a bound (so that a measurement a little under an
        object's size does not halve its requests), never over :data:`MAX_REQUEST_BYTES`; a
        fixed :data:`REQUEST_BYTES` is a bound."""
        if end <= start:
            return []
        size, target = end - start, self.request_bytes(latency_s, throughput)
        if REQUEST_BYTES is not None:
            count = math.ceil(size / target)
        else:
            count = max(round(size / target), math.ceil(size / MAX_REQUEST_BYTES), 1)
        step = math.ceil((end - start) / count)
        return [(at, min(at + step, end)) for at in range(start, end, step)]


def _average(current: float, sample: float, samples: int) -> float:
    return sample if samples == 0 else current + _WEIGHT * (sample - current)


_LINKS: dict[tuple[str, str], Link] = {}
_LINKS_LOCK = threading.Lock()


def link_for(fs: Any) -> Link:
    """The link of an fsspec filesystem: one per protocol and endpoint URL (S3-compatible
    stores are told apart by theirs), however many filesystem instances reach it."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    client_kwargs = getattr(fs, "client_kwargs", None) or {}
    endpoint = client_kwargs.get("endpoint_url") or getattr(fs, "endpoint_url", None) or ""
    key = (str(protocol), str(endpoint))
    with _LINKS_LOCK:
        return _LINKS.setdefault(key, Link())
