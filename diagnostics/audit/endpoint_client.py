"""A small JSON-over-HTTP client for an engine's endpoint, safe against a hostile or broken server.

* **Untrusted answers.** A response is read up to ``MAX_RESPONSE_BYTES`` and parsed by
  ``untrusted_json`` (bounded depth, 64-bit integers, finite numbers); malformed HTTP (an endless
  header line, more than 100 headers, a bad status line or chunk, a body cut short) is a one-line
  ``EndpointError``.
* **Deadlines.** Each request ends within ``timeout_s`` (default ``TIMEOUT_S``) from connect to
  last byte: a watchdog shuts the socket at the deadline and the body is read in chunks with the
  socket's timeout set to what is left, so a server dripping a byte at a time cannot hold it (a
  socket timeout alone restarts at each byte). A timeout is not retried; the retries of one
  request (``RETRIES``, exponential back-off on a refused connection, 429 and 5xx) all end within
  ``RETRY_BUDGET`` × ``timeout_s``; all of a client's requests within its ``total_timeout_s``.
* **Credentials.** ``Authorization: Bearer`` goes to the endpoint's origin (scheme, host, port)
  only: a redirect within it is followed (at most ``MAX_REDIRECTS``), one to any other origin is
  refused with a one-line error, never followed with or without the key.

Requests are spaced to at most ``rate`` per second.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from typing import Any
from urllib.parse import urljoin, urlsplit

from diagnostics.untrusted_json import UntrustedJSONError, loads

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
RETRIES = 5
TIMEOUT_S = 120.0  # per request: connect, send, status, headers and body together, redirects included
RETRY_BUDGET = 2  # all attempts of one request (and the waits between them) end within this many --timeout
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_REDIRECTS = 5
READ_CHUNK = 64 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
REDIRECTS = (301, 302, 303, 307, 308)
RETRIED_STATUSES = (429, 500, 502, 503, 504)


class EndpointError(ValueError):
    """The endpoint cannot be used as asked; the message says what to check."""


class _Retry(Exception):
    """An attempt failed in a way a later attempt may not (refused connection, reset, 429, 5xx)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``url``, the default port filled in: what decides where credentials may go."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise EndpointError(f"the URL {url[:200]!r} has a bad port") from None
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme, 0)


def checked_timeout(value: float, name: str = "--timeout") -> float:
    """A deadline in seconds: finite, > 0 and at most ``MAX_TIMEOUT_S``; ``EndpointError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise EndpointError(f"{name} must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}], got {value}")
    return float(value)


class _Watchdog:
    """Shuts a connection's socket at a deadline, so no read (a status line or header that drips
    one byte at a time included) outlives it: a socket timeout alone restarts at every byte."""

    def __init__(self, connection: http.client.HTTPConnection, deadline: float) -> None:
        self.connection = connection
        self.fired = False
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv in the other thread
            except OSError:
                pass

    def __enter__(self) -> "_Watchdog":
        self.timer.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.timer.cancel()


class Client:
    """A small JSON-over-HTTP client: retries, a bounded request rate, a deadline per request (its
    retries included) and per client, redirects followed only within the endpoint's origin (the
    API key never leaves it), and every malformed answer a one-line ``EndpointError``."""

    def __init__(self, base_url: str, rate: float = 20.0, timeout_s: float = TIMEOUT_S, api_key: str | None = None,
                 total_timeout_s: float | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise EndpointError(f"the endpoint must be an http:// or https:// URL, got {base_url[:200]!r}")
        if not rate > 0:
            raise EndpointError(f"the request rate must be > 0 per second, got {rate}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.origin = origin(self.base_url)
        if not self.origin[1]:
            raise EndpointError(f"the endpoint {base_url[:200]!r} names no host")
        self.interval = 1.0 / rate
        self.timeout_s = checked_timeout(timeout_s)
        self.api_key = api_key
        self.deadline = None if total_timeout_s is None else time.monotonic() + checked_timeout(total_timeout_s, "--collect-timeout")
        self.total_timeout_s = total_timeout_s
        self._last = 0.0
        self.last_raw = b""  # the bytes of the last answer (its sha256 is kept when it is too large to keep)

    def get(self, path: str, retries: int = RETRIES) -> dict[str, Any]:
        """GET ``path`` and return the JSON object answered; ``EndpointError`` after the retries."""
        return self.post(path, None, retries)

    def post(self, path: str, body: dict[str, Any] | None, retries: int = RETRIES, allow_non_finite: bool = False) -> dict[str, Any]:
        """POST ``body`` as JSON (GET when ``None``) and return the JSON object answered; ``EndpointError``
        after the retries, or when the request's deadline (``RETRY_BUDGET`` × the timeout) passes."""
        data = None if body is None else json.dumps(body).encode()
        request_deadline = time.monotonic() + RETRY_BUDGET * self.timeout_s
        where = f"{self.base_url}{path}"
        failure = "no answer"
        for attempt in range(retries + 1):
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last = time.monotonic()
            deadline = self._attempt_deadline(request_deadline)
            try:
                raw = self._exchange(self.base_url + path, data, deadline)
            except _Retry as error:
                failure = error.message
                pause = min(8.0, 0.25 * 2**attempt)
                if attempt == retries or time.monotonic() + pause >= min(request_deadline, self.deadline or math.inf):
                    break
                time.sleep(pause)
                continue
            self.last_raw = raw
            try:
                answer = loads(raw, f"{where} answered", allow_non_finite=allow_non_finite)
            except UntrustedJSONError as error:
                raise EndpointError(f"{error}: is it an OpenAI-compatible server?") from None
            if not isinstance(answer, dict):
                raise EndpointError(f"{where} did not answer a JSON object")
            return answer
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise EndpointError(self._collection_overdue())
        raise EndpointError(f"{failure} (after {attempt + 1} attempts within {RETRY_BUDGET} × --timeout {self.timeout_s:g} s)")

    def _attempt_deadline(self, request_deadline: float) -> float:
        """This attempt's deadline: the timeout, within the request's and the client's deadlines."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise EndpointError(self._collection_overdue())
        return min(now + self.timeout_s, request_deadline, self.deadline or math.inf)

    def _collection_overdue(self) -> str:
        return (f"the collection ran past --collect-timeout {self.total_timeout_s:g} s: what was collected is kept; "
                "raise --collect-timeout or collect fewer generations (--n)")

    def _exchange(self, url: str, data: bytes | None, deadline: float) -> bytes:
        """One attempt: the request, same-origin redirects followed (at most ``MAX_REDIRECTS``), the body
        read by ``deadline``; ``_Retry`` for what may pass, ``EndpointError`` for the rest."""
        for _ in range(MAX_REDIRECTS + 1):
            status, location, raw = self._once(url, data, deadline)
            if status in REDIRECTS:
                url = self._redirect_target(url, location)
                continue
            if status in RETRIED_STATUSES:
                raise _Retry(f"{url[:300]} answered HTTP {status}: {_detail(raw)}")
            if not 200 <= status < 300:
                raise EndpointError(f"{url[:300]} answered HTTP {status}: {_detail(raw)}")
            return raw
        raise EndpointError(f"{url[:300]} redirected more than {MAX_REDIRECTS} times: give the final URL as --endpoint")

    def _redirect_target(self, url: str, location: str | None) -> str:
        """Where a redirect leads, when it stays within the endpoint's origin; never another origin,
        since the request carries the API key (``Authorization``)."""
        if not location:
            raise EndpointError(f"{url[:300]} redirected without a Location: give the final URL as --endpoint")
        target = urljoin(url, location.strip())
        if not target.startswith(("http://", "https://")) or origin(target) != self.origin:
            scheme, host, port = origin(target) if target.startswith(("http://", "https://")) else ("?", target[:100], 0)
            raise EndpointError(f"{url[:300]} redirected to another origin ({scheme}://{host}:{port}); it is not followed, "
                                "so the API key stays with the endpoint: give that URL as --endpoint if you trust it")
        return target

    def _once(self, url: str, data: bytes | None, deadline: float) -> tuple[int, str | None, bytes]:
        """One HTTP exchange: ``(status, Location, body)``; every transport or protocol failure mapped."""
        parts = urlsplit(url)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EndpointError(self._overdue(url, deadline))
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=remaining)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close"}
        if self.api_key:  # only ever sent to self.origin: _redirect_target refuses every other
            headers["Authorization"] = f"Bearer {self.api_key}"
        watchdog = _Watchdog(connection, deadline)
        try:
            with watchdog:
                connection.request("GET" if data is None else "POST", path, body=data, headers=headers)
                response = connection.getresponse()
                raw = _read_body(response, connection, deadline, url)
            if watchdog.fired:  # the socket was shut under a read: what came may be cut short
                raise EndpointError(self._overdue(url, deadline))
            return response.status, response.getheader("Location"), raw
        except EndpointError:
            raise
        except (TimeoutError, socket.timeout):
            raise EndpointError(self._overdue(url, deadline)) from None
        except http.client.RemoteDisconnected:
            if watchdog.fired:
                raise EndpointError(self._overdue(url, deadline)) from None
            raise _Retry(f"{url[:300]} closed the connection without an answer: is the server running?") from None
        except http.client.HTTPException as error:
            if watchdog.fired:
                raise EndpointError(self._overdue(url, deadline)) from None
            raise EndpointError(f"{url[:300]} answered malformed HTTP ({_protocol_problem(error)}): "
                                "is it an HTTP server speaking the OpenAI API?") from None
        except OSError as error:
            if watchdog.fired:
                raise EndpointError(self._overdue(url, deadline)) from None
            reason = getattr(error, "strerror", None) or error.__class__.__name__
            raise _Retry(f"cannot reach {url[:300]} ({reason}): is the server running?") from None
        finally:
            connection.close()

    def _overdue(self, url: str, deadline: float) -> str:
        if self.deadline is not None and deadline >= self.deadline:
            return self._collection_overdue()
        return (f"{url[:300]} did not answer within --timeout {self.timeout_s:g} s (a request's retries share "
                f"{RETRY_BUDGET} × --timeout): is the server overloaded? raise --timeout")


def _read_body(response: http.client.HTTPResponse, connection: http.client.HTTPConnection, deadline: float, url: str) -> bytes:
    """The body, read in chunks with the socket's timeout set to what is left of ``deadline`` (the
    watchdog bounds a chunk that trickles in); at most ``MAX_RESPONSE_BYTES``."""
    chunks, size = [], 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if connection.sock is not None:
            connection.sock.settimeout(remaining)
        chunk = response.read1(READ_CHUNK) if not response.isclosed() else b""
        if not chunk:
            if not response.chunked and response.length:  # read1 ends quietly where the peer closed early
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise EndpointError(f"{url[:300]} answered more than {MAX_RESPONSE_BYTES // 2**20} MiB")
        chunks.append(chunk)


def _detail(raw: bytes) -> str:
    return raw[:500].decode("utf-8", "replace").replace("\n", " ").replace("\r", " ")[:300]


def _protocol_problem(error: http.client.HTTPException) -> str:
    """What was wrong, in a few words (``http.client``'s messages can quote the whole bad line)."""
    if isinstance(error, http.client.LineTooLong):
        return "a status or header line over 64 KiB"
    if isinstance(error, http.client.IncompleteRead):
        return f"the body ended after {len(error.partial)} bytes, before its announced end"
    if isinstance(error, http.client.BadStatusLine):
        return f"a bad status line {str(error)[:80]!r}"
    text = str(error)
    if "got more than" in text and "headers" in text:
        return "more than 100 headers"
    return f"{error.__class__.__name__}: {text[:120]}"


__all__ = ["Client", "EndpointError", "MAX_REDIRECTS", "MAX_RESPONSE_BYTES", "RETRIES", "RETRY_BUDGET", "TIMEOUT_S",
           "checked_timeout", "origin"]
