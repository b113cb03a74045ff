"""pytorch_env installs uv as root: wheels only, every file checked against the role's lock. Run on
the controller (tasks/create-venv.yml) against a local index that offers uv only as an sdist whose
build would leave a marker: pip must refuse it, and the build must never run. A uv version the lock
does not pin is refused before anything is installed."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import shutil
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_local_play

REPO = Path(__file__).resolve().parents[1]
TOOLS = Path("/opt/gpuenv/tools")


def _sdist(marker: Path) -> bytes:
    """uv-0.13.9.tar.gz with an in-tree build backend (no build dependency to fetch) that, were pip
    ever to build it, writes MARKER: what any index, or anyone who can publish to it, could serve."""
    files = {
        "uv-0.13.9/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "uv-0.13.9/backend.py": f"open({str(marker)!r}, 'w').write('built as root')\n",
        "uv-0.13.9/PKG-INFO": "Metadata-Version: 2.1\nName: uv\nVersion: 0.13.9\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def sdist_index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    marker = tmp_path / "built-as-root"
    blob = _sdist(marker)
    digest = hashlib.sha256(blob).hexdigest()
    page = f'<a href="/files/uv-0.13.9.tar.gz#sha256={digest}">uv-0.13.9.tar.gz</a>'.encode()

    class Index(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = page if self.path.startswith("/simple/uv") else blob if self.path.startswith("/files/") else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple", marker
    server.shutdown()
    server.server_close()


def _run(tmp_path: Path, venv_env: dict[str, str], **role_vars: object) -> str:
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "pytorch_env_python": f"{sys.version_info.major}.{sys.version_info.minor}",
                "pytorch_env_dir": str(tmp_path / "env"),
                "pytorch_env_installer": "uv",
                **role_vars,
            },
            "tasks": [
                {
                    "name": "Install uv",
                    "ansible.builtin.include_role": {"name": "pytorch_env", "tasks_from": "create-venv.yml"},
                }
            ],
        }
    ]
    out = run_local_play(tmp_path, play, venv_env, timeout=300)
    assert out.returncode != 0, out.stdout[-3000:]
    return out.stdout


@pytest.mark.ansible
@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes /opt/gpuenv/tools as root does on a host")
def test_an_index_that_offers_uv_only_as_an_sdist_never_builds_it(
    tmp_path: Path, venv_env: dict[str, str], sdist_index: tuple[str, Path]
) -> None:
    index, marker = sdist_index
    had_lock, had_uv = (TOOLS / "uv.lock").exists(), (TOOLS / "uv").exists()
    try:
        out = _run(tmp_path, venv_env, pytorch_env_pypi_url=index)
    finally:  # the controller is left as it was
        if not had_lock:
            (TOOLS / "uv.lock").unlink(missing_ok=True)
        if not had_uv:
            shutil.rmtree(TOOLS / "uv", ignore_errors=True)
    assert "Install the pinned uv, every file checked against the lock" in out
    assert not marker.exists(), "the sdist's build ran as root"


@pytest.mark.ansible
def test_a_uv_version_the_lock_does_not_pin_is_refused(tmp_path: Path, venv_env: dict[str, str]) -> None:
    out = _run(tmp_path, venv_env, pytorch_env_uv_version="0.14.0", pytorch_env_pypi_url="http://127.0.0.1:9/simple")
    assert "pytorch_env_uv_version 0.14.0 is not the uv that uv.lock locks (0.13.9)" in out
    assert "Nothing was installed" in out
