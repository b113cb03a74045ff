"""The sandbox's servers on the bridge address: the artifact mirror's HTTP server and the download
cache (testbed.sandbox.cache), each started once, with its pid and log in the sandbox directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.sandbox import cache
from testbed.sandbox.hosts import cache_dir, downloads_dir, sandbox_dir
from testbed.sandbox.network import CACHE_PORT, MIRROR_PORT, controller_ip
from testbed.sandbox.nspawn import pid_alive, pid_of
from testbed.sandbox.util import SandboxError


def mirror_root() -> Path:
    return cache_dir() / "mirror" / "site"


def serve_mirror() -> None:
    site = mirror_root()
    site.mkdir(parents=True, exist_ok=True)
    # argv[0] names the process gpuenv-mirror so that down's sweep can find a lost one.
    argv = [
        sys.executable,
        "-c",
        "import sys, runpy; sys.argv = ['gpuenv-mirror', *sys.argv[1:]]; runpy.run_module('http.server', "
        "run_name='__main__')",
        "--bind",
        controller_ip(),
        "--directory",
        str(site),
        str(MIRROR_PORT),
    ]
    _start_server("mirror", "the mirror's HTTP server", argv, MIRROR_PORT)


def stop_mirror() -> None:
    _stop_server("mirror")


def _start_server(name: str, what: str, argv: list[str], port: int) -> None:
    """Start one of the sandbox's servers on the bridge address, once; <name>.pid and <name>.log
    in the sandbox directory."""
    pidfile = sandbox_dir() / f"{name}.pid"
    if pid_of(pidfile):
        return
    logfile = (sandbox_dir() / f"{name}.log").open("ab")
    proc = subprocess.Popen(  # noqa: S603
        argv, stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile, start_new_session=True
    )
    pidfile.write_text(str(proc.pid))
    if not cache.wait_listening(controller_ip(), port):
        raise SandboxError(f"{what} did not start; see {sandbox_dir() / (name + '.log')}")


def _stop_server(name: str) -> None:
    pidfile = sandbox_dir() / f"{name}.pid"
    pid = pid_of(pidfile)
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.1)
    pidfile.unlink(missing_ok=True)


def serve_cache(directory: Path | None = None) -> None:
    """Start the download cache on the bridge address (testbed.sandbox.cache), once."""
    directory = directory or downloads_dir()
    argv = [sys.executable, "-m", "testbed.sandbox.cache", controller_ip(), str(CACHE_PORT), str(directory)]
    _start_server("cache", "the download cache", argv, CACHE_PORT)


def stop_cache() -> None:
    _stop_server("cache")
