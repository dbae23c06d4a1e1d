"""A small HTTP fault proxy in front of the S3 server, for the fault tests and the soak (``scripts/soak``).

Point a worker at it with ``AWS_ENDPOINT_URL_S3=proxy.url``. Each request is forwarded to the real
server unless a :class:`Rule` matches it, in which case the proxy answers what a troubled S3 answers:

- ``"503"``: ``503 SlowDown`` with S3's XML error body (throttling);
- ``"500"``: ``500 InternalError``;
- ``"403"``: ``403 AccessDenied`` (what a bucket policy denying the call returns);
- ``"400"``: ``400 InvalidRequest`` (a request the server refuses as invalid: sending it again
  cannot succeed);
- ``"reset"``: forward the request, send the response head and the first ``after_bytes`` bytes of
  its body, then reset the connection (RST) mid-body;
- ``"delay"``: forward the request and hold the response ``delay`` seconds;
- ``"slow"``: forward the request and send the response body slowly, ``chunk_bytes`` at a time with
  ``delay`` seconds between them (a slow or congested link).

Every request is logged (method, path, Range, status, action) so a test can count the faults it
injected and check what the client did next (a retry of the same request, a ranged re-read from a
later byte); a long run keeps only the last ``max_log`` entries, and ``fired`` counts every fault by
action. Standard library only: one thread per connection, one request per connection (the
proxy answers ``Connection: close``, which botocore's connection pool handles like any server that
closes idle connections).
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["503", "500", "403", "400", "reset", "delay", "slow"]

_ERRORS: dict[str, tuple[str, str, str]] = {
    "503": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "403": ("403 Forbidden", "AccessDenied", "Access Denied"),
    "400": ("400 Bad Request", "InvalidRequest", "The request is not valid for this object."),
}


@dataclass
class Rule:
    """When and how to break a request. A request matches when every given criterion holds."""

    action: Action
    method: str | None = None
    """HTTP method (``GET``, ``PUT``, ``HEAD``...), any when None."""
    path: str | None = None
    """Regular expression searched in the URL-decoded path and query (``/bucket/key?...``)."""
    every: int = 1
    """Fire on every n-th matching request (1: all of them)."""
    times: int | None = None
    """Fire at most this many times (None: no limit)."""
    after_bytes: int = 0
    """``reset``: body bytes delivered before the connection is reset."""
    delay: float = 0.0
    """``delay``: seconds the response is held; ``slow``: seconds between two pieces of the body."""
    chunk_bytes: int = 16_384
    """``slow``: bytes of the body sent at a time."""
    matched: int = 0
    """Requests that matched so far."""
    fired: int = 0
    """Faults injected so far."""

    def _take(self, method: str, target: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.path is not None and not re.search(self.path, target):
            return False
        self.matched += 1
        if self.times is not None and self.fired >= self.times:
            return False
        if self.matched % self.every:
            return False
        self.fired += 1
        return True


@dataclass
class Entry:
    """One request seen by the proxy."""

    t: float
    method: str
    target: str
    """URL-decoded path and query."""
    range: str | None
    status: int | None
    """Status sent to the client (None when the connection was reset before any response)."""
    action: str | None = None
    """The fault injected, or None when the request went through untouched."""
    body_bytes_sent: int | None = None


@dataclass
class FaultProxy:
    """The proxy: ``with FaultProxy(upstream_port) as proxy: ...``."""

    upstream_port: int
    upstream_host: str = "127.0.0.1"
    rules: list[Rule] = field(default_factory=list)
    log: list[Entry] = field(default_factory=list)
    port: int = 0
    max_log: int | None = None
    """Entries kept in ``log`` (the last ones; None: all)."""
    fired: dict[str, int] = field(default_factory=dict)
    """Faults injected so far, by action (every one, whatever ``max_log`` kept)."""
    requests: int = 0
    """Requests seen so far."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    # ------------------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(128)
        self.port = server.getsockname()[1]
        self._server = server
        self._thread = threading.Thread(target=self._accept_loop, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing = True
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def remove(self, rule: Rule) -> None:
        with self._lock:
            if rule in self.rules:
                self.rules.remove(rule)

    # ------------------------------------------------------------------------------ queries

    def entries(self, method: str | None = None, path: str | None = None) -> list[Entry]:
        with self._lock:
            found = list(self.log)
        return [
            e for e in found if (method is None or e.method == method) and (path is None or re.search(path, e.target))
        ]

    def faults(self) -> list[Entry]:
        return [e for e in self.entries() if e.action not in (None, "delay")]

    def retried_faults(self) -> int:
        """Injected errors followed by a later request for the same method and path (a retry)."""
        log = self.entries()
        count = 0
        for i, entry in enumerate(log):
            if entry.action in (None, "delay"):
                continue
            if any(later.method == entry.method and later.target == entry.target for later in log[i + 1 :]):
                count += 1
        return count

    # ------------------------------------------------------------------------------ serving

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_one(conn)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _answer_error(self, conn: socket.socket, action: str, method: str, target: str) -> int:
        """Answer what a troubled S3 answers for ``action`` (S3's XML error body); the status code."""
        status, code, message = _ERRORS[action]
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{_xml_escape(target.split('?')[0])}</Resource>"
            f"<RequestId>faultproxy-{len(self.log)}</RequestId></Error>"
        ).encode()
        payload = b"" if method == "HEAD" else xml
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {len(xml)}\r\n"
            f"x-amz-request-id: faultproxy-{len(self.log)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        return int(status.split()[0])

    def _forward(self, request_line: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
        """The real server's whole response to the request, on a fresh upstream connection read to EOF."""
        forwarded = [(n, v) for n, v in headers if n.lower() not in ("connection", "expect", "keep-alive")]
        forwarded.append(("Connection", "close"))
        upstream = socket.create_connection((self.upstream_host, self.upstream_port), timeout=120)
        try:
            upstream.sendall(
                f"{request_line}\r\n".encode("latin-1")
                + b"".join(f"{n}: {v}\r\n".encode("latin-1") for n, v in forwarded)
                + b"\r\n"
                + body
            )
            chunks = []
            while True:
                data = upstream.recv(1 << 20)
                if not data:
                    break
                chunks.append(data)
        finally:
            upstream.close()
        return b"".join(chunks)

    def _serve_one(self, conn: socket.socket) -> None:
        conn.settimeout(120)
        reader = _Reader(conn)
        head = reader.until(b"\r\n\r\n")
        if not head:
            return
        request_line, headers = _parse_head(head)
        method, raw_target, _version = request_line.split(" ", 2)
        target = urllib.parse.unquote(raw_target)
        names = {name.lower(): value for name, value in headers}
        if names.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = reader.body(names)
        entry = Entry(time.time(), method, target, names.get("range"), None)
        with self._lock:
            rule = next((r for r in self.rules if r._take(method, target)), None)
            entry.action = rule.action if rule else None
            self.log.append(entry)
            self.requests += 1
            if rule is not None:
                self.fired[rule.action] = self.fired.get(rule.action, 0) + 1
            if self.max_log is not None and len(self.log) > self.max_log:
                del self.log[: len(self.log) - self.max_log]

        if rule is not None and rule.action in _ERRORS:
            entry.status = self._answer_error(conn, rule.action, method, target)
            return

        response = self._forward(request_line, headers, body)
        split = response.find(b"\r\n\r\n") + 4
        response_head, response_body = response[:split], response[split:]
        entry.status = int(response_head.split(b" ", 2)[1]) if response_head else None

        if rule is not None and rule.action == "delay":
            time.sleep(rule.delay)
        if rule is not None and rule.action == "reset" and method == "GET" and len(response_body) > rule.after_bytes:
            conn.sendall(response_head + response_body[: rule.after_bytes])
            entry.body_bytes_sent = rule.after_bytes
            # Let the client take in what was sent before the RST (Linux drops unread data on a reset).
            time.sleep(0.5)
            _reset(conn)
            return
        if rule is not None and rule.action == "reset":
            entry.status = None
            _reset(conn)
            return
        if rule is not None and rule.action == "slow":
            conn.sendall(response_head)
            for at in range(0, len(response_body), max(rule.chunk_bytes, 1)):
                time.sleep(rule.delay)
                conn.sendall(response_body[at : at + rule.chunk_bytes])
        else:
            conn.sendall(response)
        entry.body_bytes_sent = len(response_body)


def _reset(conn: socket.socket) -> None:
    """Close with an RST instead of a FIN: a connection reset by peer on the client side."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


class _Reader:
    """Buffered reads from a socket: up to a delimiter, a number of bytes, or a chunked body."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def _fill(self) -> bool:
        data = self.conn.recv(1 << 20)
        self.buf += data
        return bool(data)

    def until(self, delimiter: bytes) -> bytes:
        while delimiter not in self.buf:
            if not self._fill():
                return b""
        index = self.buf.index(delimiter) + len(delimiter)
        out, self.buf = self.buf[:index], self.buf[index:]
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("client closed mid-body")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def body(self, headers: dict[str, str]) -> bytes:
        """The raw request body, as sent (a chunked body is forwarded chunked)."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return b"".join(self._chunks())
        return self.exactly(int(headers.get("content-length", "0") or 0))

    def _chunks(self) -> Iterator[bytes]:
        while True:
            size_line = self.until(b"\r\n")
            yield size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                # Trailers, then the empty line.
                while True:
                    line = self.until(b"\r\n")
                    yield line
                    if line == b"\r\n":
                        return
            yield self.exactly(size + 2)
