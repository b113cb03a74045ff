"""The download cache's store (testbed.sandbox.cache serves it over HTTP): files that never change
under their name kept on disk, each fetched from upstream once and streamed to every client that asks
while it downloads; PyPI's pages kept for a few minutes; everything else passed through, and every
upstream fetch counted and logged."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import Any, BinaryIO

PYPI_SIMPLE = "https://pypi.org/simple"
PYPI_FILES = "https://files.pythonhosted.org"
# PyPI's project pages change when a release is published; a few minutes of staleness is what a
# site's proxy allows too, and it spares N hosts N fetches of the same page.
PAGE_TTL_S = 600
CHUNK = 1 << 20
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Headers a passed-through answer carries back to the client.
_PASSED_BACK = ("content-length", "last-modified", "content-type", "etag")


def _ssl_context() -> ssl.SSLContext:
    # The controller's bundle holds a TLS proxy's CA where there is one (corporate networks, and
    # these machines); Python's own default paths may not.
    return ssl.create_default_context(cafile=CA_BUNDLE if Path(CA_BUNDLE).exists() else None)


_DEFAULT_PORTS = {"http": 80, "https": 443}
# The upstreams apt may reach through this proxy: Debian's archive (its security suite is there too).
# PyPI is reached through /pypi/ only, never as a proxy. A site's or a test's other upstreams are
# named to the server (GPUENV_CACHE_UPSTREAMS, host:port comma-separated).
DEFAULT_UPSTREAMS = ("deb.debian.org:80",)
# The most a passed-through answer without a Content-Length may stream (InRelease is under a MB).
PASSTHROUGH_CAP = 256 << 20


def upstream_of(url: str) -> str:
    """host:port of a URL, the port spelled out; "" when it has no host."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return ""
    return f"{parts.hostname}:{port}" if parts.hostname and port else ""


def cache_key(url: str) -> str:
    """A relative path for a URL's cached copy: readable, and safe from `..` and odd characters. A
    port other than the scheme's own is part of it, so that two upstreams on one host never share
    a file."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.lstrip("/")
    safe = "/".join(re.sub(r"[^A-Za-z0-9._+~=-]", "_", p) for p in path.split("/") if p not in ("", ".", ".."))
    if parts.query:
        safe += "_q" + hashlib.sha256(parts.query.encode()).hexdigest()[:16]
    host = re.sub(r"[^A-Za-z0-9.-]", "_", parts.hostname or "_")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme):
        host += f"_{port}"
    return f"{parts.scheme}/{host}/{safe or '_index'}"


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

    def served(self, client: str, url: str | None, nbytes: int, *, once: bool, whole: int | None = None) -> None:
        """WHOLE: the file's size where a range of it was served (alone, the client would have cost
        upstream the whole file once, whatever ranges it asked for)."""
        with self.lock:
            self.served_bytes += nbytes
            entry = self.clients.setdefault(client, {"served_bytes": 0, "distinct": {}, "repeated": 0})
            entry["served_bytes"] += nbytes
            if url is None:
                return
            if once:
                entry["distinct"][url] = max(entry["distinct"].get(url, 0), whole or nbytes)
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
    """One file being fetched from upstream into `<final>.<pid>.part`, shared by every client asking.
    The pid is the server's: two sandbox instances run a server each on the same directory, and
    each fetches into its own part file (the rename to the final name is atomic either way)."""

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
        return self.final.with_name(f"{self.final.name}.{os.getpid()}.part")


class _Redirects(urllib.request.HTTPRedirectHandler):
    def __init__(self, allowed: Callable[[str, str], bool]) -> None:
        self.allowed = allowed

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if not self.allowed(req.full_url, newurl):
            raise UpstreamError(502, f"{req.full_url}: upstream redirected to {newurl[:200]}, which is not an upstream")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _orphaned(part: Path) -> bool:
    """A part file no live server writes: its server's pid is gone, or it has none (older ones)."""
    pid = part.name.removesuffix(".part").rsplit(".", 1)[-1]
    if not pid.isdigit():
        return True
    return int(pid) == os.getpid() or not Path(f"/proc/{pid}").exists()


def open_either(part: Path, final: Path) -> BinaryIO:
    """The download's file, partial or done: the part file becomes the final one by a rename at
    any moment (an open handle survives it), so try the part first and then the final name."""
    try:
        return part.open("rb")
    except FileNotFoundError:
        return final.open("rb")


def _sendable(job: Download) -> int:
    """How many bytes of a download a client may have now. The last byte waits until the file is
    complete in the store under its final name: a client that has every byte has ended its
    response, and whatever it asks next (a HEAD, a range) must find the file complete, not an
    in-flight download about to be renamed. Call with job.cond held."""
    if job.done or job.length is None:
        return job.written
    return min(job.written, job.length - 1)


def _grown(job: Download, sent: int) -> bool:
    return _sendable(job) > sent or job.done or job.error is not None


class Cache:
    def __init__(
        self,
        directory: Path,
        *,
        files_base: str,
        pypi_simple: str = PYPI_SIMPLE,
        pypi_files: str = PYPI_FILES,
        upstreams: tuple[str, ...] = DEFAULT_UPSTREAMS,
    ) -> None:
        self.directory = directory
        self.upstreams = tuple(dict.fromkeys(upstreams))
        self.files_base = files_base  # how hosts reach /pypi/files/ on this server
        self.pypi_simple = pypi_simple.rstrip("/")
        self.pypi_files = pypi_files.rstrip("/")
        self.stats = Stats()
        self._inflight: dict[str, Download] = {}
        self._lock = threading.Lock()
        self._ssl = _ssl_context()
        # Redirects are followed only to where the request could have gone itself: an upstream's
        # answer must not send the cache to the controller's loopback or a private address.
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self._ssl), _Redirects(self._redirect_allowed)
        )
        self._log_lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        # A killed server leaves partial files; they are never served, so they go. Those of a server
        # still running (another sandbox instance's) stay.
        for part in directory.rglob("*.part"):
            if _orphaned(part):
                part.unlink(missing_ok=True)

    # --- upstream --------------------------------------------------------------------------------
    def _open(self, url: str, headers: dict[str, str] | None = None) -> HTTPResponse:
        request = urllib.request.Request(url, headers={"User-Agent": "gpuenv-sandbox-cache", **(headers or {})})  # noqa: S310
        try:
            response: HTTPResponse = self._opener.open(request, timeout=60)
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
            self._publish(job)
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

    @staticmethod
    def _publish(job: Download) -> None:
        """The part file becomes the final one: from here on the file is complete in the store."""
        job.part.replace(job.final)

    def _redirect_allowed(self, old: str, new: str) -> bool:
        target = upstream_of(new)
        pypi = {upstream_of(self.pypi_simple), upstream_of(self.pypi_files)}
        return bool(target) and (target == upstream_of(old) or target in self.upstreams or target in pypi)

    def refusal(self, url: str) -> str | None:
        """Why this proxy will not fetch URL for a client (None: it will). Only its upstreams, by
        host and port: a client must not reach the controller's loopback, a private network or
        the world through it."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http":
            return f"{url[:200]}: the sandbox cache proxies plain http:// to its upstreams only"
        upstream = upstream_of(url)
        if upstream not in self.upstreams:
            return (
                f"{upstream or url[:200]} is not an upstream of the sandbox cache (it forwards to "
                f"{', '.join(self.upstreams)}); name another with GPUENV_CACHE_UPSTREAMS=host:port"
            )
        return None

    # --- what clients get -------------------------------------------------------------------------
    def complete(self, url: str) -> Path | None:
        """The cached copy of an immutable file, where it is complete on disk (ranges of it can be served)."""
        final = self.directory / cache_key(url)
        return final if final.is_file() else None

    @staticmethod
    def read_range(path: Path, start: int, end: int) -> Iterator[bytes]:
        """Bytes START to END (inclusive) of a file, in chunks."""
        with path.open("rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk

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
                    available, done = _sendable(job), job.done
                if f is None:
                    f = stack.enter_context(open_either(job.part, job.final))
                while sent < available:
                    chunk = f.read(min(CHUNK, available - sent))
                    if not chunk:
                        break
                    sent += len(chunk)
                    yield chunk
                if done and sent >= available:
                    return

    def page(self, url: str) -> bytes:
        """A PyPI project page, rewritten to this cache's file URLs; PyPI's copy is kept for PAGE_TTL_S.

        The kept copy is PyPI's own text, rewritten at each answer: the cache directory is shared by
        every sandbox instance on the machine, each with its own address, and a page kept already
        rewritten sent one instance's hosts to another's (pip: 404 on a file of a page that a
        parallel lane had refreshed)."""
        final = self.directory / (cache_key(url) + ".upstream")
        raw = None
        with contextlib.suppress(OSError):
            if time.time() - final.stat().st_mtime < PAGE_TTL_S:
                raw = final.read_bytes()
                self.stats.add(hits=1)
        if raw is None:
            self.stats.add(misses=1)
            with self._open(url, {"Accept": "text/html"}) as response:
                raw = response.read()
            self._log(url, len(raw), "page")
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f"{final.name}.{threading.get_ident()}.tmp")
            tmp.write_bytes(raw)
            tmp.replace(final)
        return rewrite_simple_page(raw.decode("utf-8"), self.files_base, self.pypi_files).encode("utf-8")

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
