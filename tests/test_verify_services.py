"""gpuenv verify's services.* checks: persistence mode, the NVSwitch fabric and a CUDA
container, each against what gpu_services recorded, with stand-in nvidia-smi, docker and podman
commands on PATH (no GPU here: what a GPU host prints is played by them, in nvidia-smi's CSV form)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuenv.verify import base, services

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _record_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "RECORD", tmp_path / "gpu_services.fact")


def _ctx(tmp_path: Path, record: dict[str, Any] | None, *, driver: bool = True) -> base.Context:
    proc = tmp_path / "proc"
    (proc / "driver/nvidia").mkdir(parents=True)
    if driver:
        (proc / "driver/nvidia/version").write_text((DATA / "proc-driver-nvidia-version-open-580.txt").read_text())
    if record is not None:
        services.RECORD.write_text(json.dumps(record))
    elif services.RECORD.exists():
        services.RECORD.unlink()
    return base.Context(proc=proc, sys_root=tmp_path / "sys")


def _command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> None:
    """A stand-in command first on PATH (a shell case on its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


WANTED = {"wanted": True, "why": "auto: data-centre GPU A100"}


def test_not_asked_for_or_not_set_up_is_a_skip_with_its_reason(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, {"persistenced": {"wanted": False, "why": "auto: no data-centre GPU (RTX 4090)"}})
    check = services.persistence_mode(ctx)
    assert check.status == "skip"
    assert "does not ask for it (auto: no data-centre GPU (RTX 4090))" in check.summary
    none = services.fabric(_ctx(tmp_path / "other", None))
    assert none.status == "skip"
    assert "gpu_services has not set it up here" in none.summary


def test_persistence_mode_on_every_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(tmp_path, {"persistenced": WANTED})
    _command(tmp_path, monkeypatch, "nvidia-smi", 'printf "0, Enabled\\n1, Enabled\\n"')
    assert services.persistence_mode(ctx).status == "pass"
    _command(tmp_path, monkeypatch, "nvidia-smi", 'printf "0, Enabled\\n1, Disabled\\n"')
    check = services.persistence_mode(ctx)
    assert (check.status, check.summary) == ("fail", "persistence mode is not Enabled on GPU 1")
    assert "systemctl enable --now nvidia-persistenced" in (check.hint or "")


def test_without_a_gpu_the_checks_skip_or_fail_under_require_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _ctx(tmp_path, {"persistenced": WANTED, "fabricmanager": WANTED})
    _command(tmp_path, monkeypatch, "nvidia-smi", 'echo "No devices were found"; exit 6')
    check = services.persistence_mode(ctx)
    assert check.status == "skip"
    assert "nvidia-smi lists no GPU (exit 6" in check.summary
    ctx.require_gpu = True
    assert services.fabric(ctx).status == "fail"


def test_the_fabric_must_be_completed_on_every_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(tmp_path, {"fabricmanager": {"wanted": True, "why": "auto: 6 NVSwitches"}})
    _command(tmp_path, monkeypatch, "nvidia-smi", 'printf "0, Completed, Success\\n1, Completed, Success\\n"')
    assert services.fabric(ctx).status == "pass"
    _command(tmp_path, monkeypatch, "nvidia-smi", 'printf "0, Completed, Success\\n1, In Progress, N/A\\n"')
    check = services.fabric(ctx)
    assert (check.status, check.summary) == ("fail", "the NVSwitch fabric is not Completed, Success on GPU 1")
    assert "journalctl -u nvidia-fabricmanager" in (check.hint or "")
    # an nvidia-smi too old for the field cannot tell: a warning, not a pass
    _command(
        tmp_path, monkeypatch, "nvidia-smi", "echo 'Field \"fabric.state\" is not a valid field to query.'; exit 2"
    )
    assert services.fabric(ctx).status == "warn"


def test_a_cuda_container_where_a_runtime_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {"wanted": True, "runtimes": ["docker"], "verify_image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}
    ctx = _ctx(tmp_path, {"container_toolkit": entry})
    log = tmp_path / "docker.log"
    _command(
        tmp_path,
        monkeypatch,
        "docker",
        f'echo "$@" >> {log}\n'
        'case "$1" in info) exit 0;; run) echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-x)";; esac',
    )
    check = services.container(ctx)
    assert (check.status, check.summary) == ("pass", "docker run nvidia/cuda:12.4.1-base-ubuntu22.04 sees 1 GPUs")
    assert "run --rm --gpus all nvidia/cuda:12.4.1-base-ubuntu22.04 nvidia-smi -L" in log.read_text()
    # the runtime answers, the container does not see a GPU
    _command(
        tmp_path,
        monkeypatch,
        "docker",
        'case "$1" in info) exit 0;; run) echo "could not select device driver" >&2; exit 125;; esac',
    )
    failed = services.container(ctx)
    assert failed.status == "fail"
    assert "could not select device driver" in failed.observed


def test_the_container_check_is_optional(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_image = _ctx(tmp_path, {"container_toolkit": {"wanted": True, "runtimes": ["docker"], "verify_image": None}})
    assert "no image named" in services.container(no_image).summary
    entry = {"wanted": True, "runtimes": ["docker"], "verify_image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}
    ctx = _ctx(tmp_path / "b", {"container_toolkit": entry})
    _command(
        tmp_path,
        monkeypatch,
        "docker",
        "echo 'permission denied while trying to connect to the Docker daemon' >&2; exit 1",
    )
    check = services.container(ctx)
    assert check.status == "skip"
    assert "docker does not answer (permission denied" in check.summary
    # the runtime answers but no driver is loaded: a GPU skip
    _command(tmp_path, monkeypatch, "docker", "exit 0")
    assert services.container(_ctx(tmp_path / "c", {"container_toolkit": entry}, driver=False)).status == "skip"
