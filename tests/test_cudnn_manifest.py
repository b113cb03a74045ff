"""The cudnn role's reading of NVIDIA's manifest (tasks/tarball_manifest.yml), run for real against
a mirror served over HTTP: the refusal's sentence (gpuenv/rolechecks.py) reaches the run's output,
and a manifest that has the declared cuDNN passes to the plan."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import run_local_play

ARCHIVE = "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz"


def _manifest(version: str) -> str:
    entry = {"relative_path": ARCHIVE, "sha256": "a" * 64, "md5": "b" * 32, "size": "1"}
    return json.dumps({"release_label": "9.1.0", "cudnn": {"version": version, "linux-x86_64": {"cuda12": entry}}})


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    site = tmp_path / "site"
    site.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _play(url: str, **extra: str) -> list[dict[str, object]]:
    return [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "gpu_stack_resolved": {"cudnn": "9.1.0.70", "cudnn_release": "9.1.0", "cuda_major": "12",
                                       "cuda_tree": "/usr/local/cuda-12.4"},
                "cudnn_redist_url": url,
                "cudnn_download_retries": 0,
                **extra,
            },
            "tasks": [
                {
                    "name": "Read the manifest as the cudnn role does",
                    "ansible.builtin.include_role": {
                        "name": "cudnn", "tasks_from": "tarball_manifest.yml", "public": True,
                    },
                },
                {"name": "Show the plan", "ansible.builtin.debug": {"msg": "PLAN {{ cudnn_plan.archives[0].file }}"}},
            ],
        }
    ]  # fmt: skip


@pytest.mark.ansible
def test_a_mirror_without_the_manifest_is_refused_with_what_to_do(
    tmp_path: Path, mirror: str, venv_env: dict[str, str]
) -> None:
    out = run_local_play(tmp_path, _play(mirror), venv_env)
    assert out.returncode != 0
    assert f"Neither {mirror}/redistrib_9.1.0.json nor redistrib_9.1.0.70.json can be read" in out.stdout, out.stdout
    assert "give cudnn_tarball_url" in out.stdout


@pytest.mark.ansible
def test_a_manifest_of_another_build_or_checksum_is_refused(
    tmp_path: Path, mirror: str, venv_env: dict[str, str]
) -> None:
    (tmp_path / "site/redistrib_9.1.0.json").write_text(_manifest("9.1.0.69"))
    out = run_local_play(tmp_path, _play(mirror), venv_env)
    assert out.returncode != 0
    assert "the manifest has cuDNN 9.1.0.69, not 9.1.0.70; nothing was installed" in out.stdout, out.stdout
    (tmp_path / "site/redistrib_9.1.0.json").write_text(_manifest("9.1.0.70"))
    out = run_local_play(tmp_path, _play(mirror, cudnn_manifest_checksum="sha256:" + "0" * 64), venv_env)
    assert out.returncode != 0
    assert "(cudnn_manifest_checksum). Nothing was installed." in out.stdout, out.stdout


@pytest.mark.ansible
def test_the_declared_build_under_its_pinned_checksum_passes_to_the_plan(
    tmp_path: Path, mirror: str, venv_env: dict[str, str]
) -> None:
    text = _manifest("9.1.0.70")
    (tmp_path / "site/redistrib_9.1.0.json").write_text(text)
    pinned = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    out = run_local_play(tmp_path, _play(mirror, cudnn_manifest_checksum=pinned), venv_env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert f"PLAN {Path(ARCHIVE).name}" in out.stdout, out.stdout[-2000:]
