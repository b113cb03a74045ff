"""The fleet's cache of DKMS-built modules (plugins/module_utils/gpuenv_dkms.py, the gpuenv_dkms_cache
module): the key changes with anything the module depends on, the plan gives one host per key the
build and the others the wait or the restore, a damaged entry is refused, and the host side checks
again before anything reaches the postinst. The real flow (dkms mktarball, ldtarball from the
postinst) runs in molecule's nvidia_driver scenario."""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin, module_utils, run_module

REPO = Path(__file__).resolve().parents[1]
mod = load_plugin("plugins/modules/gpuenv_dkms_cache.py")
dkms = module_utils("gpuenv_dkms")
POSTINST = REPO / "tests/data/dkms/nvidia-kernel-dkms_550.163.01-2.postinst"
K1, K2 = "6.12.48+deb13-amd64", "6.12.48+deb13-cloud-amd64"
MODULE = {"name": "nvidia-current", "version": "550.163.01"}


def fields(**changes: str) -> dict[str, str]:
    base = {
        "package": "nvidia-kernel-dkms",
        "version": "550.163.01-2",
        "kernel": K1,
        "kernel_package": "6.12.48-1",
        "config_sha256": "c" * 64,
        "arch": "x86_64",
        "os": "debian 13",
        "signer": "",
    }
    return {**base, **changes}


def dkms_tarball(path: Path, kernel: str, arch: str = "x86_64", payload: bytes = b"\x7fELF module") -> Path:
    """A tarball laid out as `dkms mktarball --binaries-only -k KERNEL` writes it."""
    files = {
        f"./dkms_main_tree/{kernel}/{arch}/module/nvidia-current.ko.xz": payload,
        f"./dkms_main_tree/{kernel}/{arch}/log/make.log": b"DKMS make.log for nvidia-current-550.163.01\n",
        "./dkms_binaries_only/dkms.conf": b'PACKAGE_NAME="nvidia-current"\n',
        "./dkms_binaries_only/PACKAGE_NAME": b"nvidia-current\n",
        "./dkms_binaries_only/PACKAGE_VERSION": b"550.163.01\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def entry(cache: Path, kernel: str = K1, **changes: str) -> dict[str, Any]:
    """An entry in the controller's cache, as export writes it and the role fetches it."""
    f = fields(kernel=kernel, **changes)
    key = dkms.cache_key(f)
    tar = dkms_tarball(cache / f"{key}.tar.gz", kernel)
    record = {
        "key": key,
        "fields": f,
        "sha256": hashlib.sha256(tar.read_bytes()).hexdigest(),
        "built_by": "sb2",
        "dkms_name": "nvidia-current",
        "dkms_version": "550.163.01",
        "tarball_dir": "/usr/share/nvidia-current-dkms",
    }
    (cache / f"{key}.json").write_text(json.dumps(record))
    return record


def keyed(kernel: str = K1, **changes: str) -> dict[str, Any]:
    f = fields(kernel=kernel, **changes)
    return {"kernel": kernel, "key": dkms.cache_key(f), "fields": f}


@pytest.mark.parametrize("field", ["version", "kernel", "kernel_package", "config_sha256", "arch", "os", "signer"])
def test_any_difference_the_module_depends_on_is_another_entry(field: str) -> None:
    assert dkms.cache_key(fields()) == dkms.cache_key(fields())
    assert dkms.cache_key(fields()) != dkms.cache_key(fields(**{field: "other"}))


def test_the_module_name_and_tarball_place_come_from_the_packages_own_postinst() -> None:
    assert dkms.postinst_module(POSTINST.read_text()) == {
        "dkms_name": "nvidia-current",
        "dkms_version": "550.163.01",
        "tarball_dir": "/usr/share/nvidia-current-dkms",
    }
    assert dkms.postinst_module("#!/bin/sh\nexit 0\n") is None


def test_the_first_host_builds_identical_hosts_wait_and_another_kernel_builds_its_own(tmp_path: Path) -> None:
    hosts = [
        {"host": "sb2", "kernels": [keyed()]},
        {"host": "sb5", "kernels": [keyed()]},
        {"host": "sb6", "kernels": [keyed(K2)]},
    ]
    out = dkms.plan(str(tmp_path), hosts)["hosts"]
    assert out["sb2"]["build"] == [keyed()]
    assert out["sb2"]["wait_for"] is None
    assert out["sb5"] == {"restore": [], "build": [], "wait": [keyed()], "wait_for": "sb2", "notes": []}
    assert out["sb6"]["build"] == [keyed(K2)]
    assert out["sb6"]["wait_for"] is None
    # The waiting host's own second read does not wait again: it builds what is still missing.
    again = dkms.plan(str(tmp_path), hosts[1:2], wait=False)["hosts"]["sb5"]
    assert again["build"] == [keyed()]
    assert again["wait_for"] is None


def test_a_host_that_lacks_a_kernel_nobody_builds_builds_all_it_lacks_itself(tmp_path: Path) -> None:
    hosts = [
        {"host": "sb2", "kernels": [keyed()]},
        {"host": "sb7", "kernels": [keyed(), keyed(K2)]},
    ]
    out = dkms.plan(str(tmp_path), hosts)["hosts"]
    assert out["sb7"]["wait_for"] is None
    assert [k["kernel"] for k in out["sb7"]["build"]] == [K1, K2]


def test_a_cached_module_is_restored_without_a_build(tmp_path: Path) -> None:
    record = entry(tmp_path)
    out = dkms.plan(str(tmp_path), [{"host": "sb5", "kernels": [keyed()]}])["hosts"]["sb5"]
    assert out["build"] == []
    assert out["wait_for"] is None
    assert [(r["kernel"], r["sha256"], r["file"]) for r in out["restore"]] == [
        (K1, record["sha256"], str(tmp_path / f"{record['key']}.tar.gz"))
    ]


def test_an_entry_whose_tarball_differs_from_its_recorded_sha256_is_refused_and_built(tmp_path: Path) -> None:
    record = entry(tmp_path)
    tar = tmp_path / f"{record['key']}.tar.gz"
    tar.write_bytes(tar.read_bytes()[:-8] + b"garbage!")
    out = dkms.plan(str(tmp_path), [{"host": "sb5", "kernels": [keyed()]}])["hosts"]["sb5"]
    assert out["restore"] == []
    assert out["build"] == [keyed()]
    assert "not the " + record["sha256"] + " the cache recorded" in out["notes"][0]
    assert "this host builds it and replaces the entry" in out["notes"][0]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda r, c: (c / f"{r['key']}.tar.gz").unlink(), "is missing"),
        (lambda r, c: (c / f"{r['key']}.json").write_text("{not json"), "cannot be read"),
        (lambda r, c: (c / f"{r['key']}.json").write_text(json.dumps({**r, "key": "x"})), "for another key"),
    ],
)
def test_a_damaged_entry_is_refused_saying_what_is_wrong(tmp_path: Path, damage: Any, says: str) -> None:
    record = entry(tmp_path)
    damage(record, tmp_path)
    out = dkms.plan(str(tmp_path), [{"host": "sb5", "kernels": [keyed()]}])["hosts"]["sb5"]
    assert out["build"] == [keyed()]
    assert says in out["notes"][0]


def test_the_host_checks_the_copy_again_and_puts_one_tarball_with_every_kernel_where_the_postinst_looks(
    tmp_path: Path,
) -> None:
    cache, staging, share = tmp_path / "cache", tmp_path / "staging", tmp_path / "share"
    cache.mkdir()
    staging.mkdir()
    entries = []
    for kernel in (K1, K2):
        record = entry(cache, kernel)
        (staging / f"{record['key']}.tar.gz").write_bytes((cache / f"{record['key']}.tar.gz").read_bytes())
        entries.append({**record, "kernel": kernel, "tarball_dir": str(share)})
    out = mod.restore(entries, str(staging))
    assert out["restored"] == [K1, K2]
    assert out["refused"] == []
    assert out["tarball"] == str(share / "nvidia-current-550.163.01.dkms.tar.gz")
    with tarfile.open(out["tarball"]) as tar:
        names = tar.getnames()
    assert f"./dkms_main_tree/{K1}/x86_64/module/nvidia-current.ko.xz" in names
    assert f"./dkms_main_tree/{K2}/x86_64/module/nvidia-current.ko.xz" in names
    assert names.count("./dkms_binaries_only/dkms.conf") == 1
    assert stat.S_IMODE(os.stat(out["tarball"]).st_mode) == 0o644


def test_a_copy_that_changed_on_its_way_is_refused_and_nothing_is_put_in_place(tmp_path: Path) -> None:
    record = entry(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / f"{record['key']}.tar.gz").write_bytes(b"truncated")
    out = mod.restore([{**record, "kernel": K1, "tarball_dir": str(tmp_path / "share")}], str(staging))
    assert out["restored"] == []
    assert out["tarball"] == ""
    assert out["changed"] is False
    assert "the cache recorded" in out["refused"][0]["why"]
    assert not (tmp_path / "share").exists()


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda p: dkms_tarball(p, K2), f"no module for kernel {K1}"),
        (lambda p: p.write_bytes(b"not a tarball"), "not a readable tarball"),
    ],
)
def test_a_tarball_that_does_not_hold_the_kernels_module_is_refused(tmp_path: Path, build: Any, says: str) -> None:
    path = tmp_path / "t.tar.gz"
    build(path)
    assert says in dkms.check_tarball(str(path), K1, "x86_64")


def test_a_tarball_that_writes_outside_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("../../etc/cron.d/x")
        tar.addfile(info, io.BytesIO(b""))
    assert "outside itself" in dkms.check_tarball(str(path), K1, "x86_64")


def test_facts_key_each_kernel_by_its_config_and_the_signing_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / f"config-{K1}").write_text('CONFIG_CC_VERSION_TEXT="gcc (Debian 14.2.0-19) 14.2.0"\n')
    (tmp_path / "os-release").write_text('ID=debian\nVERSION_ID="13"\n')
    monkeypatch.setattr(mod, "BOOT", str(boot))
    monkeypatch.setattr(mod, "OS_RELEASE", str(tmp_path / "os-release"))
    monkeypatch.setattr(mod, "DKMS_TREE", str(tmp_path / "dkms"))
    out = mod.facts("nvidia-kernel-dkms", "550.163.01-2", {K1: "6.12.48-1", K2: "6.12.48-1"}, "", MODULE)
    # K2 has no config here: no key, so it is built as DKMS always would.
    assert [k["kernel"] for k in out["kernels"]] == [K1]
    assert out["kernels"][0]["fields"]["os"] == "debian 13"
    assert out["shareable"] is True
    cert = tmp_path / "mok.pub"
    cert.write_bytes(b"\x30\x82fleet certificate")
    signed = mod.facts("nvidia-kernel-dkms", "550.163.01-2", {K1: "6.12.48-1"}, str(cert), MODULE)
    assert signed["kernels"][0]["fields"]["signer"] == hashlib.sha256(cert.read_bytes()).hexdigest()
    assert signed["kernels"][0]["key"] != out["kernels"][0]["key"]
    # Without the certificate DKMS makes a key of the host's own: nothing it builds is shared.
    own = mod.facts("nvidia-kernel-dkms", "550.163.01-2", {K1: "6.12.48-1"}, str(tmp_path / "absent.pub"), MODULE)
    assert own["shareable"] is False
    assert "absent.pub" in own["why"]
    # A kernel DKMS has built the module for already (a re-run, or a purged package's userspace
    # left installed) has nothing to restore or build: no key.
    (tmp_path / "dkms/nvidia-current/550.163.01" / K1 / platform.machine() / "module").mkdir(parents=True)
    again = mod.facts("nvidia-kernel-dkms", "550.163.01-2", {K1: "6.12.48-1"}, "", MODULE)
    assert again["kernels"] == []
    assert again["built"] == [K1]


def test_export_packs_each_built_kernel_with_dkms_and_records_its_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    info, tree, bin_dir, staging = (tmp_path / d for d in ("info", "dkms", "bin", "staging"))
    info.mkdir()
    # dpkg's postinsts: the module's package among others, which export finds by the module it names.
    (info / "nvidia-kernel-dkms.postinst").write_text(POSTINST.read_text())
    (info / "nvidia-open-kernel-dkms.postinst").write_text(
        POSTINST.read_text().replace("=nvidia-current", "=nvidia-current-open")
    )
    (info / "dkms.postinst").write_text("#!/bin/sh\nset -e\n")
    built = tree / "nvidia-current/550.163.01" / K1 / "x86_64/module"
    built.mkdir(parents=True)
    (built / "nvidia-current.ko.xz").write_bytes(b"module")
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # dkms's stand-in: records its arguments and writes the tarball where --archive says.
    fake = bin_dir / "dkms"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nfor a; do last=$a; done\necho tarball > "$last"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(mod, "DPKG_INFO", str(info))
    monkeypatch.setattr(mod, "DKMS_TREE", str(tree))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    k1, k2 = keyed(), keyed(K2)
    out = run_module(
        mod,
        capsys,
        {
            "mode": "export",
            "module": MODULE,
            "kernels": [k1, k2],
            "staging_dir": str(staging),
            "host": "sb2",
        },
    )
    assert out["changed"] is True
    assert [e["key"] for e in out["entries"]] == [k1["key"]]
    assert calls.read_text().split() == [
        "mktarball", "-m", "nvidia-current", "-v", "550.163.01", "-k", K1, "--binaries-only",
        "--archive", str(staging / f"{k1['key']}.tar.gz"),
    ]  # fmt: skip
    record = json.loads((staging / f"{k1['key']}.json").read_text())
    assert record["sha256"] == hashlib.sha256(b"tarball\n").hexdigest()
    assert record["modules"] == {"nvidia-current.ko.xz": hashlib.sha256(b"module").hexdigest()}
    assert record["built_by"] == "sb2"
    assert record["tarball_dir"] == "/usr/share/nvidia-current-dkms"
    # K2 was not built here: nothing to share, and a warning says so rather than failing the host.
    # (Read from export's own result: Ansible's warnings are process-wide, and depend on the tests
    # that ran before.)
    direct = mod.export(Host(), MODULE, [k1, k2], str(staging), "sb2")
    assert [e["key"] for e in direct["entries"]] == [k1["key"]]
    assert any(f"kernel {K2}" in w for w in direct["warnings"])


def test_the_plan_through_the_module_refuses_a_damaged_entry_once_for_the_play(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = entry(tmp_path)
    (tmp_path / f"{record['key']}.tar.gz").write_bytes(b"x")
    hosts = [{"host": "sb5", "kernels": [keyed()]}, {"host": "sb6", "kernels": [keyed()]}]
    out = run_module(mod, capsys, {"mode": "plan", "cache_dir": str(tmp_path), "hosts": hosts})
    assert [len(out["hosts"][h]["notes"]) for h in ("sb5", "sb6")] == [1, 0]
    assert out["hosts"]["sb5"]["build"] == [keyed()]
    assert out["hosts"]["sb6"]["wait_for"] == "sb5"


def test_export_without_the_modules_package_warns_and_shares_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "info").mkdir()
    monkeypatch.setattr(mod, "DPKG_INFO", str(tmp_path / "info"))
    out = mod.export(Host(), MODULE, [keyed()], str(tmp_path / "s"), "sb2")
    assert out["entries"] == []
    assert any("installs DKMS module nvidia-current 550.163.01" in w for w in out["warnings"])


class Host:
    """What export asks of its AnsibleModule: the host's commands, run as run_command runs them."""

    def get_bin_path(self, name: str) -> str | None:
        return shutil.which(name)

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr


def test_one_cached_kernel_is_put_in_place_as_dkms_packed_it(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    record = entry(tmp_path / "cache")
    staging = tmp_path / "staging"
    staging.mkdir()
    staged = staging / f"{record['key']}.tar.gz"
    staged.write_bytes((tmp_path / "cache" / f"{record['key']}.tar.gz").read_bytes())
    out = mod.restore([{**record, "kernel": K1, "tarball_dir": str(tmp_path / "share")}], str(staging))
    assert Path(out["tarball"]).read_bytes() == staged.read_bytes()
