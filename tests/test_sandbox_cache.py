"""The sandbox's download cache against a local stand-in for Debian's archive and PyPI: one upstream
fetch for many concurrent clients, the immutable-or-not rule, PyPI pages rewritten, upstream errors
passed on and not cached, and byte counts that match what upstream sent."""

from __future__ import annotations

import collections
import hashlib
import http.client
import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import pytest

from testbed.sandbox import cache, cache_store

BIG = bytes(range(256)) * (6 * 4096)  # 6 MiB, sent slowly so that clients overlap
SLOW_CHUNK = 256 * 1024


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hits: ClassVar[collections.Counter[str]] = collections.Counter()
    release = b"Suite: bookworm\n"
    page = ""
    unsized = 0  # bytes of an answer sent without a Content-Length (the connection's end is its end)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).hits[self.path] += 1
        if self.path == "/debian/pool/main/n/nvidia/big.deb":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BIG)))
            self.end_headers()
            for i in range(0, len(BIG), SLOW_CHUNK):
                self.wfile.write(BIG[i : i + SLOW_CHUNK])
                self.wfile.flush()
                time.sleep(0.02)
        elif self.path == "/debian/dists/bookworm/InRelease":
            self._body(type(self).release)
        elif self.path == "/debian/dists/bookworm/elsewhere":
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:1/secret")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/debian/dists/bookworm/unsized":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for _ in range(0, type(self).unsized, 1000):
                self.wfile.write(b"u" * 1000)
        elif self.path == "/simple/demo/":
            self._body(type(self).page.encode())
        elif self.path == "/files/ab/cd/demo-1.0-py3-none-any.whl":
            self._body(b"wheel bytes")
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _body(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[str, str, cache.Cache]]:
    Upstream.hits = collections.Counter()
    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    up.daemon_threads = True
    upstream = f"http://127.0.0.1:{up.server_address[1]}"
    Upstream.page = (
        f'<a href="{upstream}/files/ab/cd/demo-1.0-py3-none-any.whl#sha256={"0" * 64}">demo-1.0-py3-none-any.whl</a>'
    )
    port = _free_port()
    c = cache.Cache(
        tmp_path / "cache",
        files_base=f"http://127.0.0.1:{port}/pypi/files",
        pypi_simple=f"{upstream}/simple",
        pypi_files=f"{upstream}/files",
        upstreams=(f"127.0.0.1:{up.server_address[1]}",),
    )
    srv = cache.Server(("127.0.0.1", port), c)
    for s in (up, srv):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield upstream, f"http://127.0.0.1:{port}", c
    for s in (up, srv):
        s.shutdown()
        s.server_close()


def _via_proxy(proxy: str, url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
    with opener.open(url, timeout=30) as response:
        data: bytes = response.read()
        return data


def test_concurrent_clients_share_one_upstream_fetch(servers: tuple[str, str, cache.Cache]) -> None:
    upstream, proxy, c = servers
    url = f"{upstream}/debian/pool/main/n/nvidia/big.deb"
    with ThreadPoolExecutor(max_workers=6) as pool:
        bodies = list(pool.map(lambda _: _via_proxy(proxy, url), range(6)))
    assert all(hashlib.sha256(b).digest() == hashlib.sha256(BIG).digest() for b in bodies)
    assert Upstream.hits["/debian/pool/main/n/nvidia/big.deb"] == 1
    # Later requests come from the controller's disk.
    assert _via_proxy(proxy, url) == BIG
    assert Upstream.hits["/debian/pool/main/n/nvidia/big.deb"] == 1
    stats = cache.stats(proxy)
    assert stats["upstream_bytes"] == len(BIG)
    assert stats["upstream_requests"] == 1
    assert stats["served_bytes"] == 7 * len(BIG)
    # Each client alone would have fetched the file once: what a lone host costs upstream.
    assert stats["clients"]["127.0.0.1"] == {"served_bytes": 7 * len(BIG), "alone_bytes": len(BIG)}
    logged = [json.loads(line) for line in (c.directory / "upstream.jsonl").read_text().splitlines()]
    assert logged == [{"t": logged[0]["t"], "url": url, "bytes": len(BIG), "kind": "cached"}]


def test_clients_that_arrive_while_the_download_ends_get_it_whole(servers: tuple[str, str, cache.Cache]) -> None:
    """Clients that attach at any moment, the last ones as the part file becomes the final one."""
    upstream, proxy, _ = servers
    url = f"{upstream}/debian/pool/main/n/nvidia/big.deb"

    def late(delay: float) -> bytes:
        time.sleep(delay)
        return _via_proxy(proxy, url)

    with ThreadPoolExecutor(max_workers=24) as pool:
        bodies = list(pool.map(late, [i * 0.03 for i in range(24)]))
    assert all(b == BIG for b in bodies)
    assert Upstream.hits["/debian/pool/main/n/nvidia/big.deb"] == 1


def test_the_part_or_the_final_file_is_opened(tmp_path: Path) -> None:
    final = tmp_path / "x.deb"
    final.write_bytes(b"done")
    with cache.open_either(tmp_path / "x.deb.part", final) as f:  # renamed before it was opened
        assert f.read() == b"done"


def test_what_may_change_is_fetched_every_time(servers: tuple[str, str, cache.Cache]) -> None:
    upstream, proxy, _ = servers
    url = f"{upstream}/debian/dists/bookworm/InRelease"
    assert _via_proxy(proxy, url) == b"Suite: bookworm\n"
    Upstream.release = b"Suite: bookworm\nDate: later\n"
    assert _via_proxy(proxy, url) == b"Suite: bookworm\nDate: later\n"
    assert Upstream.hits["/debian/dists/bookworm/InRelease"] == 2
    # A lone client pays for every passed-through request. The server counts a transfer after its
    # last byte is out, so the client may ask before the count: wait for it, a few seconds at most.
    deadline = time.monotonic() + 5
    while (
        alone := cache.stats(proxy)["clients"]["127.0.0.1"]["alone_bytes"]
    ) != 16 + 28 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alone == 16 + 28


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - http to the test's own servers
        data: bytes = response.read()
        return data


def test_pypi_pages_point_at_the_cache_and_files_are_kept(servers: tuple[str, str, cache.Cache]) -> None:
    _, base, _ = servers
    page = _get(f"{base}/pypi/simple/demo/").decode()
    assert f'href="{base}/pypi/files/ab/cd/demo-1.0-py3-none-any.whl#sha256=' in page
    _get(f"{base}/pypi/simple/demo/")
    assert Upstream.hits["/simple/demo/"] == 1  # kept for PAGE_TTL_S
    for _ in range(2):
        assert _get(f"{base}/pypi/files/ab/cd/demo-1.0-py3-none-any.whl") == b"wheel bytes"
    assert Upstream.hits["/files/ab/cd/demo-1.0-py3-none-any.whl"] == 1


def _ranged(url: str, span: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Range": span} if span else {}, method=method)  # noqa: S310 - the test's own servers
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the test's own servers
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), b""


def test_a_kept_file_is_served_in_the_ranges_asked_for_as_pypi_s_file_host_does(
    servers: tuple[str, str, cache.Cache],
) -> None:
    # uv reads a wheel's metadata from the end of the file with range requests (a HEAD first, for
    # Accept-Ranges): without them it streams the whole wheel, torch's 906 MB, to resolve.
    _, base, c = servers
    url = f"{base}/pypi/files/ab/cd/demo-1.0-py3-none-any.whl"
    status, headers, body = _ranged(url, "bytes=0-4")
    assert (status, body) == (200, b"wheel bytes")  # not whole in the cache yet: all of it, from the start
    assert "Accept-Ranges" not in headers
    status, headers, _ = _ranged(url, "", method="HEAD")
    assert (status, headers["Accept-Ranges"], headers["Content-Length"]) == (200, "bytes", "11")
    assert _ranged(url, "bytes=0-4")[::2] == (206, b"wheel")
    status, headers, body = _ranged(url, "bytes=-5")
    assert (status, body, headers["Content-Range"]) == (206, b"bytes", "bytes 6-10/11")
    assert _ranged(url, "bytes=6-")[::2] == (206, b"bytes")
    assert _ranged(url, "bytes=6-400")[::2] == (206, b"bytes")
    assert _ranged(url, "bytes=11-")[0] == 416
    assert _ranged(url, "bytes=5-3")[::2] == (200, b"wheel bytes")  # last before first: no range, ignored
    assert _ranged(url, "bytes=0-1,4-5")[::2] == (200, b"wheel bytes")  # several ranges: the whole file
    assert Upstream.hits["/files/ab/cd/demo-1.0-py3-none-any.whl"] == 1
    # What this client alone would have cost upstream: the file once, whole.
    assert c.stats.snapshot()["clients"]["127.0.0.1"]["alone_bytes"] == 11


def test_a_client_s_download_ends_only_once_the_file_is_complete_in_the_store(
    servers: tuple[str, str, cache.Cache], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that has had every byte of a fetched file asks next for a range or a HEAD (uv does),
    and must find the file complete: the download's rename to its final name is held here until
    the client's GET and HEAD are done, or until a timeout where the GET cannot end first."""
    _, base, _ = servers
    url = f"{base}/pypi/files/ab/cd/demo-1.0-py3-none-any.whl"
    client_done = threading.Event()
    rename_reached = threading.Event()
    publish = cache.Cache._publish

    def held(job: cache_store.Download) -> None:
        rename_reached.set()
        client_done.wait(timeout=3)
        publish(job)

    monkeypatch.setattr(cache.Cache, "_publish", staticmethod(held))
    answers: list[tuple[int, dict[str, str], bytes]] = []

    def client() -> None:
        answers.append(_ranged(url, ""))
        answers.append(_ranged(url, "", method="HEAD"))
        client_done.set()

    thread = threading.Thread(target=client)
    thread.start()
    thread.join(timeout=30)
    assert rename_reached.is_set()
    assert answers[0][::2] == (200, b"wheel bytes")
    status, headers, _ = answers[1]
    assert (status, headers.get("Accept-Ranges"), headers["Content-Length"]) == (200, "bytes", "11")


def test_upstream_errors_reach_the_client_and_are_not_cached(servers: tuple[str, str, cache.Cache]) -> None:
    upstream, proxy, c = servers
    url = f"{upstream}/debian/pool/main/g/gone/gone_1.0_amd64.deb"
    for _ in range(2):
        with pytest.raises(urllib.error.HTTPError) as info:
            _via_proxy(proxy, url)
        assert info.value.code == 404
        assert "gone_1.0_amd64.deb: upstream answered 404" in info.value.read().decode()
    assert Upstream.hits["/debian/pool/main/g/gone/gone_1.0_amd64.deb"] == 2
    assert not list(c.directory.rglob("gone_1.0_amd64.deb*"))


def test_a_client_that_hangs_up_does_not_end_the_download(servers: tuple[str, str, cache.Cache]) -> None:
    upstream, proxy, c = servers
    url = f"{upstream}/debian/pool/main/n/nvidia/big.deb"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
    response = opener.open(url, timeout=30)
    assert response.read(1000) == BIG[:1000]
    response.close()
    final = c.directory / cache.cache_key(url)
    deadline = time.monotonic() + 20
    while not final.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert final.read_bytes() == BIG
    assert not list(final.parent.glob(final.name + ".*part"))


def test_partial_files_of_a_killed_server_are_removed(tmp_path: Path) -> None:
    pool = tmp_path / "c/http/deb.debian.org/debian/pool"
    pool.mkdir(parents=True)
    # An older server's part file (no pid), and one of a pid above any pid_max (never alive).
    parts = [pool / "x.deb.part", pool / "y.deb.999999999.part"]
    for part in parts:
        part.write_bytes(b"half")
    cache.Cache(tmp_path / "c", files_base="http://x/pypi/files")
    assert not [p for p in parts if p.exists()]


def test_a_part_file_another_live_server_writes_is_kept(tmp_path: Path) -> None:
    # Two sandbox instances run a download cache each on the same directory: one starting must not
    # remove the file the other is still fetching into.
    pool = tmp_path / "c/http/deb.debian.org/debian/pool"
    pool.mkdir(parents=True)
    with subprocess.Popen(["sleep", "30"]) as other:  # noqa: S607
        try:
            part = pool / f"x.deb.{other.pid}.part"
            part.write_bytes(b"half")
            c = cache.Cache(tmp_path / "c", files_base="http://x/pypi/files")
            assert part.exists()
            assert c is not None
        finally:
            other.kill()


def test_cache_keys_stay_inside_the_cache() -> None:
    key = cache.cache_key("http://deb.debian.org/debian/../../etc/passwd")
    assert key == "http/deb.debian.org/debian/etc/passwd"
    assert ".." not in cache.cache_key("https://files.pythonhosted.org/packages/a/../b c.whl?x=1")


def test_a_page_kept_by_one_instance_points_another_at_its_own_address(
    servers: tuple[str, str, cache.Cache], tmp_path: Path
) -> None:
    # Every sandbox instance's cache server shares the machine's cache directory, each on its own
    # address: a page one instance fetched and kept must not send another instance's hosts to it.
    _, base, first = servers
    _get(f"{base}/pypi/simple/demo/")
    other = cache.Cache(
        first.directory,
        files_base="http://10.199.9.1:3142/pypi/files",
        pypi_simple=first.pypi_simple,
        pypi_files=first.pypi_files,
    )
    page = other.page(f"{first.pypi_simple}/demo/").decode()
    assert 'href="http://10.199.9.1:3142/pypi/files/ab/cd/demo-1.0-py3-none-any.whl#sha256=' in page
    assert base not in page
    assert Upstream.hits["/simple/demo/"] == 1  # the kept copy served it


def test_the_proxy_forwards_to_its_upstreams_only(servers: tuple[str, str, cache.Cache]) -> None:
    """Not an open proxy: the controller's loopback, a private network, another port of the same
    host or TLS are refused with 403 and the reason, and nothing is fetched for them."""
    upstream, proxy, c = servers
    port = int(upstream.rsplit(":", 1)[1])
    for url in (
        f"http://127.0.0.1:{port + 1}/debian/pool/main/n/nvidia/big.deb",
        "http://10.0.0.1/debian/dists/bookworm/InRelease",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost/",
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _via_proxy(proxy, url)
        assert refused.value.code == 403
        assert "is not an upstream of the sandbox cache" in refused.value.read().decode()
    assert c.stats.snapshot()["upstream_requests"] == 0
    assert Upstream.hits == {}
    assert c.refusal("https://deb.debian.org/debian/") is not None
    # An upstream's redirect elsewhere is not followed either.
    with pytest.raises(urllib.error.HTTPError) as redirected:
        _via_proxy(proxy, f"{upstream}/debian/dists/bookworm/elsewhere")
    assert redirected.value.code == 502
    assert "which is not an upstream" in redirected.value.read().decode()
    assert c.refusal(f"{upstream}/debian/dists/bookworm/InRelease") is None
    assert cache.Cache(c.directory, files_base="http://x/pypi/files").refusal("http://deb.debian.org/debian/x") is None


def test_two_ports_of_one_host_never_share_a_cached_file() -> None:
    one = cache.cache_key("http://mirror.example:8080/debian/pool/x.deb")
    two = cache.cache_key("http://mirror.example:9090/debian/pool/x.deb")
    assert one != two
    # The default port keeps the keys a warm cache already has.
    assert cache.cache_key("http://deb.debian.org:80/debian/pool/x.deb") == "http/deb.debian.org/debian/pool/x.deb"
    assert cache.cache_key("http://deb.debian.org/debian/pool/x.deb") == "http/deb.debian.org/debian/pool/x.deb"


def test_an_answer_without_a_length_streams_and_is_cut_at_the_cap(
    servers: tuple[str, str, cache.Cache], monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, proxy, _ = servers
    monkeypatch.setattr(cache, "PASSTHROUGH_CAP", 64 * 1024)
    Upstream.unsized = 1 << 20
    try:
        body = _via_proxy(proxy, f"{upstream}/debian/dists/bookworm/unsized")
    except (urllib.error.URLError, OSError, http.client.IncompleteRead) as exc:  # cut short: the connection ends
        body = getattr(exc, "partial", b"")
    finally:
        Upstream.unsized = 0
    assert len(body) <= 64 * 1024
    Upstream.unsized = 1000
    try:
        # In HTTP/1.1 chunks, and the connection stays open for the next request: apt pipelines its
        # requests and reports an "Undetermined Error" for a body that ends with the connection.
        host, port = proxy.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        for _ in range(2):
            connection.request("GET", f"{upstream}/debian/dists/bookworm/unsized")
            answer = connection.getresponse()
            assert (answer.status, answer.getheader("Transfer-Encoding"), answer.read()) == (
                200,
                "chunked",
                b"u" * 1000,
            )
        connection.close()
    finally:
        Upstream.unsized = 0
