"""The GPU checks' bodies, run here on the CPU device with this Python's torch, so that an error in
them is found before the first GPU host; their GPU-only parts (CUDA, cuDNN, float16 with the
scaler's scaling, NCCL) run only where torch sees a GPU, and are skipped with that reason
elsewhere. The controller's venv has no torch (requirements/controller.lock): there every test
here that needs one is skipped, saying so; run them with a Python that has torch, e.g.
`PYTHONPATH=. <env>/bin/python -m pytest tests/test_verify_compute.py`."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuenv.verify import base, cli, compute, distributed, plan, torchenv
from gpuenv.verify.model import PASS, SKIP, Check

NO_TORCH = "torch is not importable in this Python (the controller's venv has none); these tests need one"
COMPUTE_IDS = ["gpu.conv_cudnn", "gpu.matmul", "gpu.bandwidth", "gpu.autocast", "gpu.train_cnn"]


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch", reason=NO_TORCH)


@pytest.fixture(scope="module")
def cuda(torch: Any) -> Any:
    if not (torch.version.cuda and torch.cuda.is_available()):
        pytest.skip("the GPU-only part: torch sees no CUDA device here")
    return torch


def test_the_compute_checks_are_declared_in_their_order() -> None:
    assert [s.id for s in compute.CHECKS.specs] == COMPUTE_IDS


@pytest.mark.parametrize("check_id", COMPUTE_IDS)
def test_each_compute_check_runs_on_the_cpu_device(torch: Any, check_id: str) -> None:
    (spec,) = [s for s in compute.CHECKS.specs if s.id == check_id]
    check = spec(base.Context(torch=torch, device=torch.device("cpu")))  # unguarded: an error shows its trace
    assert (check.id, check.status) == (check_id, PASS), check
    assert check.observed is not None  # a pass observed something


def test_autocast_on_the_cpu_is_bfloat16_with_a_grad_scaler_step(torch: Any) -> None:
    check = compute.autocast(base.Context(torch=torch, device=torch.device("cpu")))
    assert check.observed == ["bfloat16"]


def test_the_small_cnn_learns_on_the_cpu(torch: Any) -> None:
    first, last = compute.train_cnn(base.Context(torch=torch, device=torch.device("cpu"))).observed
    assert last < first


def test_cpu_selftest_is_the_compute_checks_on_the_cpu(torch: Any, capsys: pytest.CaptureFixture[str]) -> None:
    checks = plan.cpu_selftest(torch)
    assert [(c.id, c.status) for c in checks] == [(i, PASS) for i in COMPUTE_IDS]
    assert all(c.seconds > 0 for c in checks)
    assert cli.main(["--cpu-selftest"]) == 0
    assert "gpu.train_cnn" in capsys.readouterr().out


def test_the_all_reduce_over_gloo_between_two_forked_ranks(torch: Any) -> None:
    if torch.version.cuda and torch.cuda.is_available():
        pytest.skip("the GPU-only part: a host with a GPU runs one rank per GPU over NCCL (molecule, a GPU host)")
    check = distributed.all_reduce.run(base.Context(torch=torch))
    assert (check.status, check.observed) == (PASS, {"backend": "gloo", "processes": 2}), check


def test_the_all_reduce_s_ranks_meet_through_a_private_file_store_not_a_port(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify may run as root: a TCPStore on a port it picked and released is a port any local
    account can race for. No TCPStore is made, and the store's directory is verify's alone."""
    if torch.version.cuda and torch.cuda.is_available():
        pytest.skip("the GPU-only part: a host with a GPU runs one rank per GPU over NCCL (molecule, a GPU host)")
    import importlib  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    # The module, not the function torch.distributed exports under the same name.
    rendezvous = importlib.import_module("torch.distributed.rendezvous")

    def no_tcp_store(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a TCPStore was made")

    monkeypatch.setattr(torch.distributed, "TCPStore", no_tcp_store)
    monkeypatch.setattr(rendezvous, "TCPStore", no_tcp_store)
    made: list[tuple[str, int]] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        path = real_mkdtemp(*args, **kwargs)
        made.append((path, os.stat(path).st_mode & 0o777))
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    check = distributed.all_reduce.run(base.Context(torch=torch))
    assert (check.status, check.observed) == (PASS, {"backend": "gloo", "processes": 2}), check
    [(path, mode)] = made
    assert mode == 0o700
    assert not os.path.exists(path)  # removed after the check


def test_the_compute_checks_on_a_gpu(cuda: Any) -> None:
    checks = plan.run(compute.CHECKS.specs, base.Context(torch=cuda))
    assert [(c.id, c.status) for c in checks] == [(i, PASS) for i in COMPUTE_IDS], checks
    assert "float16" in checks[COMPUTE_IDS.index("gpu.autocast")].observed


def test_without_a_device_they_skip_or_fail_when_a_gpu_is_required() -> None:
    cpu_build = SimpleNamespace(version=SimpleNamespace(cuda=None), cuda=SimpleNamespace(is_available=lambda: False))
    skipped = plan.run(compute.CHECKS.specs, base.Context(torch=cpu_build))
    assert {(c.status, c.observed) for c in skipped} == {(SKIP, base.NO_GPU)}
    failed = plan.run(compute.CHECKS.specs, base.Context(torch=cpu_build, require_gpu=True))
    assert {c.status for c in failed} == {"fail"}
    assert all(c.hint == base.GPU_HINT for c in failed)


def test_every_check_runs_alone_as_it_runs_among_the_others(torch: Any, tmp_path: Path) -> None:
    """No check relies on an earlier one having run: each, alone on a fresh context, finds what it
    finds in the full run (timings aside)."""
    expect = {"torch": torch.__version__.split("+")[0], "cuda": "12.4.1", "cudnn": "9.1.0.70"}

    def fresh() -> base.Context:
        return base.Context(expect=expect, torch=torch, device=torch.device("cpu"), ldconfig_cache="")

    timed = {"gpu.matmul", "gpu.bandwidth", "gpu.train_cnn", "dist.all_reduce"}
    together = {c.id: c for c in plan.run_checks(fresh(), distributed=False)}
    for spec in plan.CHECKS:
        if spec.id in together and spec.id not in timed:
            alone = spec.run(fresh())
            assert (alone.status, alone.summary) == (together[spec.id].status, together[spec.id].summary), spec.id


def _mapped_cudnn(tmp_path: Path, prefix: Path, library: Path) -> Check:
    """cudnn.loaded_library for a CUDA torch in `prefix` whose process has `library` mapped."""
    torch_file = prefix / "lib/python3.13/site-packages/torch/__init__.py"
    torch_file.parent.mkdir(parents=True)
    torch_file.touch()
    library.parent.mkdir(parents=True, exist_ok=True)
    library.touch()
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/maps").write_text(f"7f00-7f10 r-xp 00000000 08:01 42 {library}\n")
    fake = SimpleNamespace(
        __file__=str(torch_file),
        version=SimpleNamespace(cuda="12.4"),
        backends=SimpleNamespace(cudnn=SimpleNamespace(version=lambda: 90100)),
    )
    ctx = base.Context(torch=fake, proc=tmp_path / "proc", prefix=str(prefix))
    return torchenv.loaded_library(ctx)


def test_a_conda_environment_s_own_cudnn_in_its_lib_is_torch_s(tmp_path: Path) -> None:
    # conda's pytorch loads the channel's cudnn package from $PREFIX/lib, not from site-packages.
    prefix = tmp_path / "env"
    check = _mapped_cudnn(tmp_path, prefix, prefix / "lib/libcudnn.so.9")
    assert check.status == "pass", check


def test_a_cudnn_from_a_cuda_tree_shadows_torch_s_own(tmp_path: Path) -> None:
    check = _mapped_cudnn(tmp_path, tmp_path / "env", tmp_path / "usr/local/cuda-12.4/lib64/libcudnn.so.9")
    assert check.status == "warn", check
    assert "shadows torch's own" in (check.hint or "")
