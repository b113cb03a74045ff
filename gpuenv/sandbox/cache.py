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

Every upstream fetch is counted (`GET /_gpuenv/stats`) and logged to `upstream.jsonl` in the
cache directory: the benchmarks read the bytes that really left the machine from there.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shutil
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.client import HTTPResponse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

PYPI_SIMPLE = "https://pypi.org/simple"
PYPI_FILES = "https://files.pythonhosted.org"
# PyPI's project pages change when a release is published; a few minutes of staleness is what a
# site's proxy allows too, and it spares N hosts N fetches of the same page.
PAGE_TTL_S = 600
CHUNK = 1 << 20
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Paths whose content never changes under the same name (Debian's archive layout).
_IMMUTABLE_APT = re.compile(r"/(pool|by-hash)/")
# Headers a passed-through request carries upstream, and those its answer carries back.
_PASSED_ON = ("if-modified-since", "if-none-match")
_PASSED_BACK = ("content-length", "last-modified", "content-type", "etag")


def _ssl_context() -> ssl.SSLContext:
    # The controller's bundle holds a TLS proxy's CA where there is one (corporate networks, and
    # these machines); Python's own default paths may not.
    return ssl.create_default_context(cafile=CA_BUNDLE if Path(CA_BUNDLE).exists() else None)


def cache_key(url: str) -> str:
    """A relative path for a URL's cached copy: readable, and safe from `..` and odd characters."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.lstrip("/")
    safe = "/".join(re.sub(r"[^A-Za-z0-9._+~=-]", "_", p) for p in path.split("/") if p not in ("", ".", ".."))
    if parts.query:
        safe += "_q" + hashlib.sha256(parts.query.encode()).hexdigest()[:16]
    return f"{parts.scheme}/{parts.hostname}/{safe or '_index'}"


def rewrite_simple_page(html: str, files_base: str, upstream_files: str = PYPI_FILES) -> str:
    """PyPI's simple page with its file links pointed at this cache."""
    return html.replace(upstream_files.rstrip("/") + "/", files_base.rstrip("/") + "/")


@dataclass
class Stats:
    upstream_bytes: int = 0
    upstream_requests: int = 0
    served_bytes: int = 0
    hits: int = 0
    misses: int = 0
    passthrough: int = 0
    # Per client: what it was served, and what it alone would have cost upstream with an empty
    # cache (each file and page once, each passed-through request every time).
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def served(self, client: str, url: str | None, nbytes: int, *, once: bool) -> None:
        with self.lock:
            self.served_bytes += nbytes
            entry = self.clients.setdefault(client, {"served_bytes": 0, "distinct": {}, "repeated": 0})
            entry["served_bytes"] += nbytes
            if url is None:
                return
            if once:
                entry["distinct"][url] = nbytes
            else:
                entry["repeated"] += nbytes

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            counts: dict[str, Any] = {
                k: getattr(self, k)
                for k in ("upstream_bytes", "upstream_requests", "served_bytes", "hits", "misses", "passthrough")
            }
            counts["clients"] = {
                ip: {"served_bytes": c["served_bytes"], "alone_bytes": sum(c["distinct"].values()) + c["repeated"]}
                for ip, c in self.clients.items()
            }
            return counts


class UpstreamError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Download:
    """One file being fetched from upstream into `<final>.part`, shared by every client asking."""

    url: str
    final: Path
    cond: threading.Condition = field(default_factory=threading.Condition)
    length: int | None = None
    written: int = 0
    started: bool = False
    done: bool = False
    error: UpstreamError | None = None

    @property
    def part(self) -> Path:
        return self.final.with_name(self.final.name + ".part")


def _open_either(part: Path, final: Path) -> BinaryIO:
    """The download's file, partial or done: the part file becomes the final one by a rename at
    any moment (an open handle survives it), so try the part first and then the final name."""
    try:
        return part.open("rb")
    except FileNotFoundError:
        return final.open("rb")


def _grown(job: Download, sent: int) -> bool:
    return job.written > sent or job.done


class Cache:
    def __init__(
        self, directory: Path, *, files_base: str, pypi_simple: str = PYPI_SIMPLE, pypi_files: str = PYPI_FILES
    ) -> None:
        self.directory = directory
        self.files_base = files_base  # how hosts reach /pypi/files/ on this server
        self.pypi_simple = pypi_simple.rstrip("/")
        self.pypi_files = pypi_files.rstrip("/")
        self.stats = Stats()
        self._inflight: dict[str, Download] = {}
        self._lock = threading.Lock()
        self._ssl = _ssl_context()
        self._log_lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        # A killed server leaves partial files; they are never served, so they go.
        for part in directory.rglob("*.part"):
            part.unlink(missing_ok=True)

    # --- upstream --------------------------------------------------------------------------------
    def _open(self, url: str, headers: dict[str, str] | None = None) -> HTTPResponse:
        request = urllib.request.Request(url, headers={"User-Agent": "gpuenv-sandbox-cache", **(headers or {})})  # noqa: S310
        try:
            response: HTTPResponse = urllib.request.urlopen(request, timeout=60, context=self._ssl)  # noqa: S310
            return response
        except urllib.error.HTTPError as exc:
            raise UpstreamError(exc.code, f"{url}: upstream answered {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UpstreamError(502, f"{url}: upstream unreachable ({exc})") from None

    def _log(self, url: str, nbytes: int, kind: str) -> None:
        self.stats.add(upstream_bytes=nbytes, upstream_requests=1)
        line = json.dumps({"t": round(time.time(), 3), "url": url, "bytes": nbytes, "kind": kind})
        with self._log_lock, (self.directory / "upstream.jsonl").open("a") as log:
            log.write(line + "\n")

    def _fetch(self, job: Download) -> None:
        """Runs in its own thread, so a client that hangs up does not end a download others share."""
        try:
            with self._open(job.url) as response:
                length = response.headers.get("Content-Length")
                job.final.parent.mkdir(parents=True, exist_ok=True)
                with job.part.open("wb") as out:
                    with job.cond:
                        job.length = int(length) if length else None
                        job.started = True
                        job.cond.notify_all()
                    while chunk := response.read(CHUNK):
                        out.write(chunk)
                        out.flush()
                        with job.cond:
                            job.written += len(chunk)
                            job.cond.notify_all()
            if job.length is not None and job.written != job.length:
                raise UpstreamError(502, f"{job.url}: upstream sent {job.written} of {job.length} bytes")
            job.part.replace(job.final)
            self._log(job.url, job.written, "cached")
            with job.cond:
                job.length = job.written
                job.done = True
                job.cond.notify_all()
        except (UpstreamError, OSError) as exc:
            job.part.unlink(missing_ok=True)
            err = exc if isinstance(exc, UpstreamError) else UpstreamError(502, f"{job.url}: {exc}")
            with job.cond:
                job.error = err
                job.started = True
                job.done = True
                job.cond.notify_all()
        finally:
            with self._lock:
                self._inflight.pop(str(job.final), None)

    # --- what clients get -------------------------------------------------------------------------
    def cached(self, url: str) -> tuple[int, Iterator[bytes]]:
        """(length, chunks) of an immutable file, from disk or from the shared download."""
        final = self.directory / cache_key(url)
        if final.is_file():
            self.stats.add(hits=1)
            return final.stat().st_size, self._read_file(final)
        with self._lock:
            if final.is_file():  # finished between the check above and the lock
                self.stats.add(hits=1)
                return final.stat().st_size, self._read_file(final)
            job = self._inflight.get(str(final))
            if job is None:
                job = Download(url=url, final=final)
                self._inflight[str(final)] = job
                self.stats.add(misses=1)
                threading.Thread(target=self._fetch, args=(job,), daemon=True).start()
            else:
                self.stats.add(hits=1)
        with job.cond:
            # Headers first: the length is needed before the client gets a byte. A file whose
            # upstream sends no length is served once it is complete.
            job.cond.wait_for(lambda: job.error is not None or (job.started and (job.length is not None or job.done)))
            if job.error is not None:
                raise job.error
        if job.done or job.length is None:
            return final.stat().st_size, self._read_file(final)
        return job.length, self._follow(job)

    @staticmethod
    def _read_file(path: Path) -> Iterator[bytes]:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    @staticmethod
    def _follow(job: Download) -> Iterator[bytes]:
        sent = 0
        with contextlib.ExitStack() as stack:
            f: BinaryIO | None = None
            while True:
                with job.cond:
                    job.cond.wait_for(functools.partial(_grown, job, sent), timeout=30)
                    if job.error is not None:
                        raise job.error
                    available, done = job.written, job.done
                if f is None:
                    f = stack.enter_context(_open_either(job.part, job.final))
                while sent < available:
                    chunk = f.read(min(CHUNK, available - sent))
                    if not chunk:
                        break
                    sent += len(chunk)
                    yield chunk
                if done and sent >= available:
                    return

    def page(self, url: str) -> bytes:
        """A PyPI project page, rewritten to this cache's file URLs, kept for PAGE_TTL_S."""
        final = self.directory / cache_key(url)
        with contextlib.suppress(OSError):
            if time.time() - final.stat().st_mtime < PAGE_TTL_S:
                self.stats.add(hits=1)
                return final.read_bytes()
        self.stats.add(misses=1)
        with self._open(url, {"Accept": "text/html"}) as response:
            raw = response.read()
        self._log(url, len(raw), "page")
        body = rewrite_simple_page(raw.decode("utf-8"), self.files_base, self.pypi_files).encode("utf-8")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}.{threading.get_ident()}.tmp")
        tmp.write_bytes(body)
        tmp.replace(final)
        return body

    def passthrough(self, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], Iterator[bytes]]:
        """Anything that may change under its name (apt's InRelease): fetched every time."""
        self.stats.add(passthrough=1)
        try:
            response = self._open(url, headers)
        except UpstreamError as exc:
            if exc.status == 304:
                return 304, {}, iter(())
            raise
        keep = {k: v for k, v in response.headers.items() if k.lower() in _PASSED_BACK}

        def body() -> Iterator[bytes]:
            total = 0
            with response:
                while chunk := response.read(CHUNK):
                    total += len(chunk)
                    yield chunk
            self._log(url, total, "passthrough")

        return response.status, keep, body()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # apt and pip keep connections open and pipeline requests
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _send(
        self,
        status: int,
        length: int,
        chunks: Iterator[bytes],
        extra: dict[str, str] | None = None,
        *,
        url: str | None = None,
        once: bool = True,
    ) -> None:
        self.send_response(status)
        for key, value in (extra or {}).items():
            if key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
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
        self.server.cache.stats.served(self.client_address[0], url, sent, once=once)

    def _error(self, status: int, message: str) -> None:
        body = (message + "\n").encode()
        self._send(status, len(body), iter([body]), {"Content-Type": "text/plain; charset=utf-8"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        cache = self.server.cache
        try:
            if self.path.startswith("http://"):
                url = self.path
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
                    if length < 0:  # no length from upstream: read it whole first
                        data = b"".join(body)
                        length, body = len(data), iter([data])
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
                length, chunks = cache.cached(url)
                self._send(200, length, chunks, {"Content-Type": "application/octet-stream"}, url=url)
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


def serve(bind: str, port: int, directory: Path) -> None:
    cache = Cache(directory, files_base=f"http://{bind}:{port}/pypi/files")
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
