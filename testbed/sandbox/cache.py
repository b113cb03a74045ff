"""The sandbox's download cache: one HTTP server on the controller's bridge address that the hosts
use as apt's HTTP proxy (Debian's archive) and as their Python package index (PyPI).

A site has the same pieces under other names (apt-cacher-ng, a devpi or Artifactory PyPI proxy);
the sandbox brings its own so that its hosts behave like a site's: many hosts, each file fetched
from upstream once. Files that never change under their name are cached on the controller's disk:
Debian's `pool/` and `by-hash/` files, and PyPI's files (their paths carry their hash). Everything
else (InRelease, PyPI's project pages) is passed through, or kept for a few minutes.

Concurrent requests for a file being downloaded share the one download: the first starts it, and
every client, the first included, is streamed from the partial file as it grows. So N hosts that
ask at once cost one upstream fetch, and none of them waits without bytes (pip gives up after 15 s
of silence).

A PyPI file that is whole on disk is served in the byte ranges asked for (`Range`, answered 206),
as PyPI's file host and a site's proxy do: uv reads a wheel's metadata from the end of the file
when PyPI's page gives none (torch's wheels), and without ranges it streamed torch's 906 MB to
resolve, 11 s of a fresh host's environment stage here that PyPI itself would not cost.

Every upstream fetch is counted (`GET /_gpuenv/stats`) and logged to `upstream.jsonl` in the
cache directory: the benchmarks read the bytes that really left the machine from there. The store
itself (what is kept, shared and counted) is testbed.sandbox.cache_store; this module is its HTTP face.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from testbed.sandbox.cache_store import (
    DEFAULT_UPSTREAMS,
    PASSTHROUGH_CAP,
    Cache,
    Stats,
    UpstreamError,
    cache_key,
    open_either,
    rewrite_simple_page,
)

# The store's names its users (the fleet, the benchmarks, the tests) take from here.
__all__ = [
    "Cache",
    "Server",
    "Stats",
    "UpstreamError",
    "cache_key",
    "clear",
    "open_either",
    "rewrite_simple_page",
    "serve",
    "stats",
    "wait_listening",
]

# Paths whose content never changes under the same name (Debian's archive layout).
_IMMUTABLE_APT = re.compile(r"/(pool|by-hash)/")
# Headers a passed-through request carries upstream.
_PASSED_ON = ("if-modified-since", "if-none-match")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The first and last byte of a Range header's one range ("bytes=0-99", "bytes=100-",
    "bytes=-500") in a file of SIZE bytes; None to send the whole file (no header, or one this
    cache does not answer, such as several ranges: a server may ignore Range); (-1, -1) for a range
    that lies past the end (416)."""
    match = re.fullmatch(r"\s*bytes=([0-9]*)-([0-9]*)\s*", header or "")
    if not match or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        return (max(size - int(last), 0), size - 1) if int(last) > 0 and size > 0 else (-1, -1)
    start = int(first)
    if last and int(last) < start:  # not a range at all: ignored, as RFC 9110 says
        return None
    if start >= size:
        return (-1, -1)
    return start, min(int(last), size - 1) if last else size - 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # apt and pip keep connections open and pipeline requests
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _head(self, status: int, extra: dict[str, str], last: tuple[str, str]) -> bool:
        """The status line and headers (upstream's length never passed on: LAST says how the body
        ends); False when no body follows (HEAD)."""
        self.send_response(status)
        for key, value in extra.items():
            if key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header(*last)
        self.end_headers()
        return self.command != "HEAD"

    def _send(
        self,
        status: int,
        length: int,
        chunks: Iterator[bytes],
        extra: dict[str, str] | None = None,
        *,
        url: str | None = None,
        once: bool = True,
        whole: int | None = None,
    ) -> None:
        if not self._head(status, extra or {}, ("Content-Length", str(length))):
            return
        sent = 0
        try:
            for chunk in chunks:
                self.wfile.write(chunk)
                sent += len(chunk)
        except (UpstreamError, OSError) as exc:
            # The headers are out: the only way left to tell the client is to end the connection
            # short of Content-Length, which apt and pip treat as a failed transfer and retry.
            self.close_connection = True
            self.log_message("%s", f"transfer of {url or self.path} ended after {sent} of {length} bytes: {exc}")
            return
        self.server.cache.stats.served(self.client_address[0], url, sent, once=once, whole=whole)

    def _send_unsized(self, status: int, chunks: Iterator[bytes], extra: dict[str, str], *, url: str) -> None:
        """An answer whose length upstream did not give (its own answer was chunked): streamed in
        HTTP/1.1 chunks as it comes, and cut at PASSTHROUGH_CAP, the connection ended without the
        last chunk, so that no client makes the cache hold or pass on an endless body."""
        if not self._head(status, extra, ("Transfer-Encoding", "chunked")):
            return
        sent = 0
        try:
            for chunk in chunks:
                if sent + len(chunk) > PASSTHROUGH_CAP:
                    self.close_connection = True
                    cut = f"{url}: cut at {PASSTHROUGH_CAP} bytes, the cap on an answer without a length"
                    self.log_message("%s", cut)
                    return
                if chunk:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
        except (UpstreamError, OSError) as exc:
            self.close_connection = True
            self.log_message("%s", f"transfer of {url} ended after {sent} bytes: {exc}")
            return
        self.server.cache.stats.served(self.client_address[0], url, sent, once=False)

    def _send_file(self, url: str) -> None:
        """A PyPI file, or the byte range asked for where the file is complete in the cache, as
        PyPI's file host answers ranges: uv reads a wheel's metadata from its end that way rather
        than download the wheel (torch's 906 MB) to resolve."""
        cache = self.server.cache
        octets = {"Content-Type": "application/octet-stream"}
        path = cache.complete(url)
        if path is None:  # not (yet) whole on disk: the shared download, from the start
            length, chunks = cache.cached(url)
            self._send(200, length, chunks, octets, url=url)
            return
        size = path.stat().st_size
        span = byte_range(self.headers.get("Range"), size)
        cache.stats.add(hits=1)
        if span is None:
            self._send(200, size, cache.read_range(path, 0, size - 1), {**octets, "Accept-Ranges": "bytes"}, url=url)
        elif span == (-1, -1):
            self._send(416, 0, iter([]), {"Content-Range": f"bytes */{size}"})
        else:
            start, end = span
            headers = {**octets, "Accept-Ranges": "bytes", "Content-Range": f"bytes {start}-{end}/{size}"}
            self._send(206, end - start + 1, cache.read_range(path, start, end), headers, url=url, whole=size)

    def _error(self, status: int, message: str) -> None:
        body = (message + "\n").encode()
        self._send(status, len(body), iter([body]), {"Content-Type": "text/plain; charset=utf-8"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        cache = self.server.cache
        try:
            if self.path.startswith(("http://", "https://")) or "://" in self.path.split("/", 1)[0]:
                url = self.path
                why = cache.refusal(url)
                if why:
                    self._error(403, why)
                    return
                if _IMMUTABLE_APT.search(urllib.parse.urlsplit(url).path):
                    length, chunks = cache.cached(url)
                    self._send(200, length, chunks, {"Content-Type": "application/octet-stream"}, url=url)
                else:
                    wanted = {k: v for k, v in self.headers.items() if k.lower() in _PASSED_ON}
                    status, headers, body = cache.passthrough(url, wanted)
                    if status == 304:
                        self.send_response(304)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    length = int(headers.get("Content-Length", "-1"))
                    if length < 0:  # no length from upstream: streamed as it comes, to a cap
                        self._send_unsized(status, body, headers, url=url)
                    else:
                        self._send(status, length, body, headers, url=url, once=False)
            elif self.path.startswith("/pypi/simple/"):
                project = self.path[len("/pypi/simple/") :].split("?")[0].strip("/")
                if not project:
                    self._error(404, "ask for a project: /pypi/simple/<name>/")
                    return
                url = f"{cache.pypi_simple}/{project}/"
                page = cache.page(url)
                self._send(200, len(page), iter([page]), {"Content-Type": "text/html; charset=utf-8"}, url=url)
            elif self.path.startswith("/pypi/files/"):
                rest = self.path[len("/pypi/files/") :].split("#")[0]
                url = f"{cache.pypi_files}/{rest}"
                self._send_file(url)
            elif self.path == "/_gpuenv/stats":
                counts = json.dumps(cache.stats.snapshot()).encode()
                self._send(200, len(counts), iter([counts]), {"Content-Type": "application/json"})
            else:
                self._error(
                    404,
                    "the sandbox cache serves apt (as an HTTP proxy), /pypi/simple/<project>/ and /pypi/files/...",
                )
        except UpstreamError as exc:
            with contextlib.suppress(OSError):
                self._error(exc.status if exc.status >= 400 else 502, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; a shared download goes on for the others


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], cache: Cache) -> None:
        self.cache = cache
        super().__init__(address, Handler)


def upstreams_from_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The default upstreams and those GPUENV_CACHE_UPSTREAMS adds (host:port, comma-separated)."""
    extra = (environ if environ is not None else dict(os.environ)).get("GPUENV_CACHE_UPSTREAMS", "")
    return (*DEFAULT_UPSTREAMS, *(u.strip() for u in extra.split(",") if u.strip()))


def serve(bind: str, port: int, directory: Path) -> None:
    cache = Cache(directory, files_base=f"http://{bind}:{port}/pypi/files", upstreams=upstreams_from_env())
    server = Server((bind, port), cache)
    print(f"gpuenv sandbox cache on http://{bind}:{port}/ (files in {directory})", file=sys.stderr, flush=True)
    server.serve_forever()


def stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/_gpuenv/stats", timeout=5) as response:  # noqa: S310
        loaded: dict[str, Any] = json.loads(response.read())
    return loaded


def wait_listening(host: str, port: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return True
        time.sleep(0.2)
    return False


def clear(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
