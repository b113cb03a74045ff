"""gpuenv verify's checks that need no torch and no GPU, on saved real output and on a stand-in
/proc and /sys tree; its reports. The torch checks run in the sandbox's environments, the compute
checks' bodies on the CPU device in test_verify_compute.py, the zipapp in test_verify_bundle.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import gpuenv
from gpuenv.verify import base, cli, cuda_tree, driver, host, model, outputs, plan, torchenv
from gpuenv.verify.model import Check
from tests.conftest import REPO

DATA = Path(__file__).parent / "data"


def test_cudnn_int_is_what_torch_reports() -> None:
    assert torchenv.cudnn_int("9.1.0.70") == 90100
    assert torchenv.cudnn_int("9.20.0.48") == 92000  # 2.13.0+cu130 reports 92000 (molecule/pytorch_env)
    assert torchenv.cudnn_int("8.9.7.29") == 8907


def _proc(tmp_path: Path, driver: str | None = None, modules: str = "") -> base.Context:
    proc = tmp_path / "proc"
    (proc / "driver/nvidia").mkdir(parents=True)
    if driver:
        (proc / "driver/nvidia/version").write_text((DATA / driver).read_text())
    (proc / "modules").write_text(modules)
    return base.Context(proc=proc, sys_root=tmp_path / "sys")


def test_kernel_driver_from_a_saved_proc_file(tmp_path: Path) -> None:
    ctx = _proc(tmp_path, "proc-driver-nvidia-version-open-580.txt")
    check = driver.kernel(ctx)
    assert (check.status, check.observed) == ("pass", "580.95.05")


def test_no_driver_is_a_skip_with_its_reason_or_a_failure_when_a_gpu_is_required(tmp_path: Path) -> None:
    ctx = _proc(tmp_path)
    skipped = driver.kernel(ctx)
    assert skipped.status == "skip"
    assert "no NVIDIA kernel module is loaded" in skipped.summary
    ctx.require_gpu = True
    failed = driver.kernel(ctx)
    assert failed.status == "fail"
    assert failed.hint is not None


def test_a_driver_library_mismatch_fails_with_the_fix(tmp_path: Path) -> None:
    ctx = _proc(tmp_path)
    ctx.driver_kernel, ctx.driver_user = "550.163.01", "580.95.05"
    check = driver.match(ctx)
    assert check.status == "fail"
    assert "Driver/library version mismatch" in (check.hint or "")
    ctx.driver_user = "550.163.01"
    assert driver.match(ctx).status == "pass"


def test_the_driver_match_needs_no_driver_kernel_check_before_it(tmp_path: Path) -> None:
    """driver.match read what driver.kernel had left in the context; now each reads the host."""
    proc = tmp_path / "proc"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/version").write_text((DATA / "proc-driver-nvidia-version-open-580.txt").read_text())
    ctx = base.Context(proc=proc)
    ctx.userspace = base.Userspace("580.95.05", "NVML")
    check = driver.match(ctx)
    assert (check.status, check.observed, check.expected) == ("pass", "580.95.05", "580.95.05")


def test_driver_minimum(tmp_path: Path) -> None:
    ctx = _proc(tmp_path)
    ctx.expect = {"torch_min_driver": "525.60.13"}
    ctx.driver_user = "535.309.01"
    assert driver.cuda_minimum(ctx).status == "pass"
    ctx.driver_user = "470.256.02"
    assert driver.cuda_minimum(ctx).status == "fail"


def test_nouveau_and_secure_boot(tmp_path: Path) -> None:
    ctx = _proc(tmp_path, modules="nouveau 2654208 0 - Live 0x0\n")
    assert host.nouveau(ctx).status == "fail"
    ctx = _proc(tmp_path / "b", modules="nvidia 1 0 - Live 0x0\n")
    assert host.nouveau(ctx).status == "pass"
    efivars = tmp_path / "b/sys/firmware/efi/efivars"
    efivars.mkdir(parents=True)
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\x00\x00\x00\x00")
    assert host.secure_boot(ctx).observed == "off"


def test_cuda_tree_from_a_real_ptxas_and_header(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    ptxas = home / "bin/ptxas"
    ptxas.write_text("#!/bin/sh\ncat " + str(DATA / "ptxas-version-12.4.131.txt") + "\n")
    ptxas.chmod(0o755)
    (home / "include/cudnn_version.h").write_text((DATA / "cudnn_version-9.1.0.70.h").read_text())
    ctx = base.Context(cuda_home=home, expect={"cuda": "12.4.1", "cudnn": "9.1.0.70"})
    assert [(c.id, c.status) for c in (cuda_tree.toolkit(ctx), cuda_tree.cudnn(ctx))] == [
        ("cuda_tree.toolkit", "pass"),
        ("cuda_tree.cudnn", "pass"),
    ]
    ctx.expect = {"cuda": "12.1.1", "cudnn": "9.2.0.82"}
    assert [c.status for c in (cuda_tree.toolkit(ctx), cuda_tree.cudnn(ctx))] == ["fail", "fail"]


def test_reports() -> None:
    checks = [
        Check("driver.kernel", "skip", "skipped, no GPU"),
        Check("torch.build", "pass", "torch 2.13.0+cpu", observed={"torch": "2.13.0+cpu"}),
        Check("cudnn.version", "fail", "cuDNN 90100, not 9.20.0.48", observed=90100, expected=92000, hint="x"),
    ]
    report = model.to_report(checks, "sb1")
    assert report["schema_version"] == 2
    assert report["exit_code"] == 1
    assert report["counts"] == {"pass": 1, "fail": 1, "warn": 0, "skip": 1}
    json.dumps(report)
    suite = ET.fromstring(outputs.to_junit(checks, "sb1"))  # noqa: S314 - XML this test just made
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    prom = outputs.to_prometheus(checks, "sb1")
    assert 'gpuenv_verify_check{host="sb1",check="cudnn.version",status="fail"} 1' in prom
    assert 'gpuenv_verify_exit_code{host="sb1"} 1' in prom


def test_without_torch_verify_still_writes_every_report_and_exits_2(tmp_path: Path) -> None:
    # This Python without its site-packages (-S): the standard library and gpuenv, and no torch,
    # as an environment whose torch is gone.
    stack = tmp_path / "stack.json"
    stack.write_text('{"torch": "2.5.1", "cuda": "12.4.1"}')
    out = {name: tmp_path / name for name in ("v.json", "v.xml", "v.prom")}
    argv = ["--stack", str(stack), "--json", str(out["v.json"]), "--junit", str(out["v.xml"])]
    run = subprocess.run(
        [sys.executable, "-S", "-m", "gpuenv.verify", *argv, "--prom", str(out["v.prom"]), "--no-distributed"],
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    report = json.loads(out["v.json"].read_text())
    assert report["exit_code"] == 2
    assert report["stack_id"] == model.stack_id({"torch": "2.5.1", "cuda": "12.4.1"})
    assert report["generated"].endswith("+00:00")
    (check,) = report["checks"]
    assert (check["id"], check["status"]) == ("verify.run", "fail")
    assert check["summary"].startswith("cannot import torch with ")
    assert "No module named 'torch'" in check["observed"]
    assert ET.fromstring(out["v.xml"].read_text()).get("failures") == "1"  # noqa: S314 - XML verify just wrote
    assert 'gpuenv_verify_exit_code{host="' in out["v.prom"].read_text()
    assert "error: ModuleNotFoundError" in run.stdout


def test_a_missing_environment_or_stack_or_a_crash_is_reported_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "v.json"
    missing = "/opt/gpuenv/envs/default/bin/python"
    assert cli.main(["--python-missing", missing, "--json", str(out)]) == 2
    assert json.loads(out.read_text())["checks"][0]["summary"] == f"the environment's Python {missing} does not exist"
    assert cli.main(["--stack", str(tmp_path / "none.json"), "--json", str(out)]) == 2
    assert json.loads(out.read_text())["checks"][0]["summary"].startswith("cannot read the stack to check against")

    class FakeTorch:  # enough for import, not for the checks: run_checks breaks
        pass

    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    monkeypatch.setattr(plan, "run_checks", lambda ctx, distributed, watchdog: 1 / 0)
    assert cli.main(["--json", str(out)]) == 2
    check = json.loads(out.read_text())["checks"][0]
    assert check["summary"] == "gpuenv verify itself failed (ZeroDivisionError)"


def test_the_resolved_stack_carries_what_verify_compares() -> None:
    from gpuenv import compat, rules, stack  # noqa: PLC0415 - the controller's side of the contract

    data = compat.load()
    resolved = rules.check(stack.parse_stack({"profile": "torch-2.5-cu124"}, data), data).resolved
    assert {k: resolved[k] for k in ("torch", "torch_cuda", "torch_cudnn", "torch_min_driver", "cuda", "cudnn")} == {
        "torch": "2.5.1",
        "torch_cuda": "12.4",
        "torch_cudnn": "9.1.0.70",
        "torch_min_driver": "525.60.13",
        "cuda": "12.4.1",
        "cudnn": "9.1.0.70",
    }


def test_the_json_report_matches_its_versioned_schema() -> None:
    import jsonschema  # noqa: PLC0415 - a controller-side test dependency

    schema = json.loads((Path(gpuenv.__file__).parent / "data/verify.schema.json").read_text())
    checks = [
        Check("driver.kernel", "skip", "skipped"),
        Check("cudnn.version", "fail", "x", observed=90100, expected=92000, hint="fix it", seconds=0.5),
    ]
    report = json.loads(json.dumps(model.to_report(checks, "sb1"), default=str))
    jsonschema.validate(report, schema)
    report["checks"][0]["status"] = "ok"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, schema)


def test_check_ids_may_hold_digits_and_every_declared_id_fits_the_schema() -> None:
    """The schema's id pattern once allowed letters and underscores only ("nvlink.gpu0" could not be
    reported); a check id is a lower-case prefix, a dot, and a name, digits allowed after the first
    character."""
    import jsonschema  # noqa: PLC0415 - a controller-side test dependency

    schema = json.loads((Path(gpuenv.__file__).parent / "data/verify.schema.json").read_text())
    ids = [spec.id for spec in plan.CHECKS] + ["verify.run", "drift.cudnn", "nvlink.gpu0_link1", "sm90.fp8", "a.2"]
    report = model.to_report([Check(i, "pass", "ok") for i in ids], "sb1")
    jsonschema.validate(json.loads(json.dumps(report)), schema)
    for bad in ("GPU.matmul", "gpu", "9gpu.matmul", "gpu.mat-mul", "gpu.matmul.extra"):
        report["checks"][0]["id"] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(report, schema)


def test_the_kernel_module_of_a_real_mismatch(tmp_path: Path) -> None:
    ctx = _proc(tmp_path, "proc-driver-nvidia-version-mismatch-580.173.02.txt")
    assert driver.kernel(ctx).observed == "580.173.02"


def test_a_check_that_crashes_is_that_checks_failure() -> None:
    def broken(ctx: base.Context, me: base.Spec) -> Check:
        raise RuntimeError("cuDNN version incompatibility: PyTorch was compiled against (9, 20, 0)")

    check = base.Spec("cudnn.version", "cuDNN", broken).run(base.Context())
    assert (check.id, check.status) == ("cudnn.version", "fail")
    assert "compiled against (9, 20, 0)" in check.observed


def test_the_environment_kind_and_a_conda_builds_cuda_minor(tmp_path: Path) -> None:
    (tmp_path / "conda/conda-meta").mkdir(parents=True)
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv/pyvenv.cfg").write_text("home = /usr/bin\n")
    assert torchenv.environment_kind(str(tmp_path / "conda")) == "conda"
    assert torchenv.environment_kind(str(tmp_path / "venv")) == "venv"
    assert torchenv.environment_kind(str(tmp_path)) == "system"
    # conda-forge's pytorch for the stack's cu124 may be its cuda126 build (cuda-version >=12.4,<13)
    assert torchenv._cuda_matches("12.6", "12.4", "conda")
    assert not torchenv._cuda_matches("12.6", "12.4", "venv")  # a wheel is exactly its variant
    assert not torchenv._cuda_matches("12.2", "12.4", "conda")
    assert not torchenv._cuda_matches("13.0", "12.4", "conda")
    assert torchenv._cuda_matches("12.4", "12.4", "venv")
    assert torchenv._cuda_matches(None, None, "venv")  # a CPU build, declared so


def test_loader_problems_resolve_through_the_given_reader(tmp_path: Path) -> None:
    """gpuenv doctor resolves a host tree's paths inside that tree: the check's logic takes its reader."""
    files = {"/usr/local/cuda/lib64/libcudnn.so.9": "/usr/local/cuda-12.4/lib/libcudnn.so.9.1.0"}
    files["/usr/local/cuda-12.4/lib/libcudnn.so.9"] = files["/usr/local/cuda/lib64/libcudnn.so.9"]
    cache = {
        "libcudnn.so.9": ["/usr/local/cuda/lib64/libcudnn.so.9"],
        "libcudnn_ops.so.9": ["/usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9"],
    }
    files["/usr/local/cuda-12.4/lib/libcudnn_ops.so.9"] = "/usr/local/cuda-12.4/lib/libcudnn_ops.so.9.1.0"
    files["/usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9"] = "/usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9.0.0"
    names = ["libcudnn.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9"]
    found = cuda_tree.loader_problems(names, Path("/usr/local/cuda-12.4/lib"), cache, files.get)
    assert found == [
        "libcudnn_ops.so.9: the loader finds /usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9, not "
        "/usr/local/cuda-12.4/lib/libcudnn_ops.so.9",
        "libcudnn_cnn.so.9: not in /usr/local/cuda-12.4/lib",
    ]


def test_the_module_field_comes_through_the_runner_given() -> None:
    asked: list[list[str]] = []

    def modinfo(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
        asked.append(argv)
        if argv[-1] == "nvidia-current":  # Debian's DKMS module; modinfo knows no "nvidia" there
            return subprocess.CompletedProcess(argv, 0, "DKMS module signing key\n", "")
        return subprocess.CompletedProcess(argv, 1, "", f"modinfo: ERROR: Module {argv[-1]} not found.\n")

    assert host.module_field("signer", modinfo) == "DKMS module signing key"
    assert asked == [["modinfo", "-F", "signer", "nvidia"], ["modinfo", "-F", "signer", "nvidia-current"]]
    assert host.module_field("signer", lambda argv: None) is None  # no modinfo at all


def test_the_arch_list_is_observed_where_no_gpu_is_visible() -> None:
    """gpuenv doctor judges a build's kernels against the GPUs nvidia-smi lists when torch sees none."""

    class Cuda:
        @staticmethod
        def get_arch_list() -> list[str]:
            return ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]

        @staticmethod
        def is_available() -> bool:
            return False

    class Torch:
        cuda = Cuda
        version = type("V", (), {"cuda": "13.0"})

    check = torchenv.arch_coverage(base.Context(torch=Torch))
    assert (check.status, check.observed) == ("skip", Cuda.get_arch_list())


MODINFO = DATA / "modinfo-nvidia-current-550.163.01.txt"  # real output; its kernel is MODINFO_KERNEL
MODINFO_KERNEL = "6.12.117+deb13-amd64"


def _kernels(tmp_path: Path, *names: str, leftover: str = "") -> Path:
    root = tmp_path / "lib/modules"
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "modules.dep").write_text("")
    if leftover:  # a removed kernel's directory: no modules.dep, not a kernel
        (root / leftover / "updates").mkdir(parents=True)
    return root


def _modinfo_for(modules: dict[str, str]) -> Any:
    """modinfo's stand-in: the saved real output for each kernel, its vermagic made that of `modules[kernel]`."""

    def run(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
        kernel, name = argv[2], argv[-1]
        if name != "nvidia-current" or kernel not in modules:
            return subprocess.CompletedProcess(argv, 1, "", f"modinfo: ERROR: Module {name} not found.\n")
        text = MODINFO.read_text().replace(f"vermagic:       {MODINFO_KERNEL}", f"vermagic:       {modules[kernel]}")
        return subprocess.CompletedProcess(argv, 0, text, "")

    return run


def test_the_module_of_each_kernel_is_checked_against_that_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = "6.12.117+deb13-cloud-amd64"
    ctx = base.Context(modules_root=_kernels(tmp_path, MODINFO_KERNEL, other, leftover="6.1.0-9-amd64"))
    monkeypatch.setattr(host, "_run_modinfo", _modinfo_for({MODINFO_KERNEL: MODINFO_KERNEL, other: other}))
    check = host.module_kernels(ctx)
    assert check.status == "pass"
    assert check.observed == {MODINFO_KERNEL: "550.163.01", other: "550.163.01"}
    # A module another kernel's build put there (a cache entry for the wrong kernel) fails, naming both.
    monkeypatch.setattr(host, "_run_modinfo", _modinfo_for({MODINFO_KERNEL: MODINFO_KERNEL, other: MODINFO_KERNEL}))
    check = host.module_kernels(ctx)
    assert check.status == "fail"
    assert check.summary == f"the nvidia module of kernel {other} was built for kernel {MODINFO_KERNEL}"
    assert f"dkms autoinstall -k {other}" in (check.hint or "")


def test_a_kernel_without_the_module_warns_and_no_module_at_all_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = "6.12.117+deb13-cloud-amd64"
    ctx = base.Context(modules_root=_kernels(tmp_path, MODINFO_KERNEL, other))
    monkeypatch.setattr(host, "_run_modinfo", _modinfo_for({MODINFO_KERNEL: MODINFO_KERNEL}))
    check = host.module_kernels(ctx)
    assert check.status == "warn"
    assert f"linux-headers-{other}" in (check.hint or "")
    monkeypatch.setattr(host, "_run_modinfo", _modinfo_for({}))
    assert host.module_kernels(ctx).status == "skip"


def test_a_module_of_another_version_than_the_drivers_record_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = tmp_path / "facts.d"
    facts.mkdir()
    (facts / "nvidia_driver.fact").write_text(json.dumps({"version": "550.163.02"}))
    ctx = base.Context(modules_root=_kernels(tmp_path, MODINFO_KERNEL), facts_dir=facts)
    monkeypatch.setattr(host, "_run_modinfo", _modinfo_for({MODINFO_KERNEL: MODINFO_KERNEL}))
    check = host.module_kernels(ctx)
    assert check.status == "fail"
    assert "is version 550.163.01, not the driver's 550.163.02" in check.summary
