"""The classic failures that the two hosts do not have, each made on the clean gpuenv host by
the one change that causes it: a driver upgraded without a reboot, nouveau loaded, Secure Boot refusing
an unsigned module, a GPU newer than torch's kernels, torch that no longer imports."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuenv import archcompat, rules, versions
from gpuenv.compat import load
from gpuenv.doctor.driver import PROC_VERSION
from gpuenv.doctor.findings import Finding
from gpuenv.doctor.run import Diagnosis, Options, examine
from tests import doctor_hosts
from tests.doctor_hosts import GPUENV_ENV, FakeHost, clean, data, done

DATA = load()
ENV = "/opt/gpuenv/envs/default"
SMI = "/usr/bin/nvidia-smi"
EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
MODULE = "/lib/modules/6.12.48+deb13-amd64/updates/dkms/nvidia-current.ko.xz"


def diagnose(fh: FakeHost, **options: Any) -> Diagnosis:
    return examine(fh.host(), DATA, Options(**options))


def rules_of(d: Diagnosis) -> list[str]:
    return sorted(f.rule for f in d.findings)


def only(d: Diagnosis, rule: str) -> Finding:
    found = [f for f in d.findings if f.rule == rule]
    assert len(found) == 1, [(f.rule, f.message) for f in d.findings]
    return found[0]


def unloaded(fh: FakeHost, modules: str = "") -> None:
    """No nvidia module loaded: nvidia-smi says so, lspci still shows the A10."""
    fh.path(PROC_VERSION).unlink()
    fh.write("/proc/modules", "ext4 1044480 1 - Live 0x0000000000000000\n" + modules)
    fh.forget(SMI)
    fh.tool(SMI, ("*", done(data("nvidia-smi-no-module-550.163.01.txt"), 9)))
    fh.tool("/usr/bin/lspci", ("-nn", done(data("lspci-nn-a10.txt"))))


def test_driver_upgraded_without_a_reboot(tmp_path: Path) -> None:
    # The user space is 580.178, the module still loaded is 580.173.02 (real outputs of one host).
    fh = clean(tmp_path / "root", driver="580.178")
    fh.write(PROC_VERSION, data("proc-driver-nvidia-version-mismatch-580.173.02.txt"))
    fh.forget(SMI)
    fh.tool(SMI, ("*", done(data("nvidia-smi-mismatch-580.txt"), 18)))
    d = diagnose(fh)
    found = only(d, "driver-mismatch")
    assert "580.173.02" in found.message
    assert "580.178" in found.message
    assert found.where[0] == PROC_VERSION
    assert found.fix.startswith("reboot")
    assert d.driver.effective == ("580.173.02", PROC_VERSION)


def test_nouveau_loaded(tmp_path: Path) -> None:
    fh = clean(tmp_path / "root")
    unloaded(fh, "nouveau 2940928 0 - Live 0x0000000000000000\n")
    d = diagnose(fh)
    assert rules_of(d) == ["nouveau-loaded"]  # not also "driver not loaded": nouveau is why
    found = d.findings[0]
    assert found.where == ["/proc/modules"]
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in found.fix
    assert [(g.name, g.cc, g.source) for g in d.gpus] == [("A10", "8.6", "lspci")]
    # Blacklisted since, but the initramfs that loaded it is older: rebuild it.
    fh.write("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")
    found = only(diagnose(fh), "nouveau-loaded")
    assert found.where == ["/proc/modules", "/etc/modprobe.d/blacklist-nouveau.conf"]
    assert "update-initramfs -u" in found.fix


def _modinfo(signer: str) -> Any:
    def answer(argv: Sequence[str], env: Mapping[str, str] | None) -> Any:
        return done({"filename": MODULE, "signer": signer}.get(argv[2], "") + "\n")

    return answer


def test_secure_boot_refuses_the_unsigned_module(tmp_path: Path) -> None:
    fh = clean(tmp_path / "root")
    unloaded(fh)
    fh.path(EFIVAR).parent.mkdir(parents=True)
    fh.path(EFIVAR).write_bytes(b"\x06\x00\x00\x00\x01")  # attributes, then 1: on
    fh.forget("/usr/sbin/modinfo")
    fh.tool("/usr/sbin/modinfo", ("-F", _modinfo("")))
    d = diagnose(fh)
    assert rules_of(d) == ["secure-boot-unsigned"]
    assert d.findings[0].where == [EFIVAR, MODULE]
    assert "mokutil --import" in d.findings[0].fix
    # Signed, the module is not Secure Boot's to refuse: doctor says it is installed but not loaded.
    fh.forget("/usr/sbin/modinfo")
    fh.tool("/usr/sbin/modinfo", ("-F", _modinfo("DKMS module signing key")))
    d = diagnose(fh)
    assert rules_of(d) == ["driver-not-loaded"]
    assert "sudo modprobe nvidia" in d.findings[0].fix
    # Secure Boot off: the unsigned module is no finding of Secure Boot's either.
    fh.path(EFIVAR).write_bytes(b"\x06\x00\x00\x00\x00")
    fh.forget("/usr/sbin/modinfo")
    fh.tool("/usr/sbin/modinfo", ("-F", _modinfo("")))
    assert rules_of(diagnose(fh)) == ["driver-not-loaded"]


RTX5090 = "NVIDIA GeForce RTX 5090, 12.0\n"


def _pip_build_runs_on(fix: str, cc: str) -> bool:
    """Whether the torch build a fix's pip command installs has kernels for `cc` (gpuenv's data)."""
    pip = fix.split(": ", 1)[1]
    release = pip.split("torch==", 1)[1].split()[0]
    variant = pip.rsplit("/", 1)[1] if "--index-url" in pip else None
    series = DATA.torch_series(release)
    assert series is not None
    build = series.variants[variant or series.pypi_default]
    return archcompat.runs_on(cc, build.arch_list())[0]


def test_no_kernel_image_for_this_gpu(tmp_path: Path) -> None:
    # torch 2.5.1+cu124 on a Blackwell card: verify's arch check fails on the list torch reports.
    fh = clean(tmp_path / "root", driver="570.133.07", gpus=RTX5090)
    fh.forget(f"{GPUENV_ENV}/bin/python")
    report = doctor_hosts.report(
        torch__build=("pass", {"torch": "2.5.1+cu124", "cuda": "12.4", "env": "venv"}, None),
        gpu__arch_coverage=("fail", ["GPU 0 (CC 12.0): no SASS, no PTX"], doctor_hosts.ARCH_CU124),
    )
    doctor_hosts.verify_answer(fh, f"{GPUENV_ENV}/bin/python", report)
    found = only(diagnose(fh), "gpu-torch-arch")
    assert found.env == ENV
    assert "12.0" in found.message
    assert "torch.cuda.get_arch_list() in this environment" in found.why
    assert _pip_build_runs_on(found.fix, "12.0")
    # Without verify, the arch list comes from gpuenv's data for torch 2.5.1+cu124, with its sources.
    found = only(diagnose(fh, verify=False), "gpu-torch-arch")
    assert "gpuenv's data for its build (cu124)" in found.why
    assert found.sources == list(rules.ARCH_SOURCES)
    # An A10 (8.6) has sm_86 in that build: nothing to say.
    assert "gpu-torch-arch" not in rules_of(diagnose(clean(tmp_path / "a10", driver="570.133.07"), verify=False))


def test_torch_that_no_longer_imports(tmp_path: Path) -> None:
    fh = clean(tmp_path / "root")
    fh.forget(f"{GPUENV_ENV}/bin/python")
    doctor_hosts.verify_answer(fh, f"{GPUENV_ENV}/bin/python", json.loads(data("verify-no-torch.json")))
    found = only(diagnose(fh), "torch-import")
    assert found.where == [ENV]
    assert "cannot import torch" in found.message
    assert "rebuild the environment" in found.fix


def test_verify_that_hangs_is_stopped_and_said(tmp_path: Path) -> None:
    fh = clean(tmp_path / "root")
    fh.forget(f"{GPUENV_ENV}/bin/python")
    fh.tool(f"{GPUENV_ENV}/bin/python", ("*", done("", 124, "")))
    found = only(diagnose(fh, verify_timeout=7), "torch-import")
    assert "verify ran past 7 s (--verify-timeout)" in found.why
    calls = [argv for argv, _ in fh.calls if argv[0].endswith("/bin/python")]
    assert len(calls) == 1


def test_driver_new_enough_is_no_finding(tmp_path: Path) -> None:
    # The same torch 2.5.1+cu124 on the oldest driver gpuenv's data lets CUDA 12.4 run: no finding.
    minimum = DATA.toolkit_minimum_driver("12.4")
    assert minimum is not None
    assert rules_of(diagnose(clean(tmp_path / "root", driver=minimum), verify=False)) == []
    older = f"{versions.driver_branch(minimum) - 10}.60.13"
    assert rules_of(diagnose(clean(tmp_path / "old", driver=older), verify=False)) == ["driver-torch-cuda"]
