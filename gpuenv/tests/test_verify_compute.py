"""The GPU checks' bodies, run here on the CPU device with this Python's torch, so that an error in
them is found before the first GPU host; their GPU-only parts (CUDA, cuDNN, float16 with the
scaler's scaling, NCCL) run only where torch sees a GPU, and are skipped with that reason
elsewhere. The controller's venv has no torch (requirements/controller.lock): there every test
here that needs one is skipped, saying so; run them with a Python that has torch, e.g.
`PYTHONPATH=. <env>/bin/python -m pytest gpuenv/tests/test_verify_compute.py`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuenv.verify import base, cli, compute, distributed, plan
from gpuenv.verify.model import PASS, SKIP

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
