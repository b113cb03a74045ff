"""The gpuenv_apt_pin module (plugins/modules): the driver version a pin names, installed and held,
read-only in query mode and in check mode. run_command is a fake apt and dpkg whose first answers
are the saved real output of a Debian 12 host (tests/data/README.md): `apt-cache madison
nvidia-kernel-dkms`, and `dpkg-query` of the driver's packages with nvidia-smi held, libcuda1
installed, nvidia-kernel-dkms known but not installed and the kernel's headers unknown."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from tests.conftest import load_plugin

DATA = Path(__file__).parent / "data"
mod = load_plugin("plugins/modules/gpuenv_apt_pin.py")

MADISON = (DATA / "apt-cache-madison-nvidia-kernel-dkms-bookworm.txt").read_text()
DPKG_SAVED = (DATA / "dpkg-query-status-nvidia-bookworm.txt").read_text()
# The names that output was saved for (dpkg-query lists what it knows, sorted; the headers go to stderr).
DPKG_SAVED_FOR = {"linux-headers-6.1.0-50-amd64", "nvidia-smi", "libcuda1", "nvidia-kernel-dkms"}
NEWEST = "535.309.01-0+deb12u1"
HEADERS = "linux-headers-6.1.0-50-amd64"
DRIVER = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"]


class FakeDpkg:
    """dpkg-query, apt-get install and dpkg --set-selections over one package database, which starts
    as the saved output says; dpkg-query answers the saved text itself while nothing has changed."""

    def __init__(self, *, apt_fails: str = "", scripts: tuple[list[str], ...] = ()) -> None:
        self.db = hostparse.parse_dpkg_query(DPKG_SAVED)
        self.changed = False
        self.apt_fails = apt_fails
        # Commands the install's maintainer scripts run, with PATH apt's DPkg::Path where the call
        # sets it (apt sets dpkg's PATH to it, whatever its own; here the test's PATH stands in for
        # apt's default, which would find no fake update-initramfs).
        self.scripts = scripts
        self.commands: list[list[str]] = []
        self.data: list[str] = []

    def __call__(self, argv: list[str], data: str | None = None, **_: Any) -> tuple[int, str, str]:
        self.commands.append(argv)
        if argv[0] == "dpkg-query":
            assert argv[1:4] == ["-W", "-f", hostparse.DPKG_QUERY_FORMAT]
            names = argv[4:]
            if not self.changed and set(names) <= DPKG_SAVED_FOR:
                lines = [line for line in DPKG_SAVED.splitlines() if line[4:].split()[0] in names]
            else:
                lines = [
                    f"{e['want']}{e['state']}  {name} {e['version']}"
                    for name, e in sorted(self.db.items())
                    if name in names
                ]
            unknown = [n for n in names if n not in self.db]
            err = "".join(f"dpkg-query: no packages found matching {n}\n" for n in unknown)
            return (1 if unknown else 0), "".join(line + "\n" for line in lines), err
        if argv[:2] == ["apt-get", "install"]:
            if self.apt_fails:
                return 100, "", self.apt_fails
            if "--simulate" in argv:
                return (
                    0,
                    "Inst nvidia-kernel-dkms (535.309.01-0+deb12u1 Debian-Security:12/stable-security [amd64])\n",
                    "",
                )
            for entry in (a for a in argv[2:] if not a.startswith("-") and "::" not in a):
                name, _, version = entry.partition("=")
                # apt keeps a held package held; a package new to dpkg gets the selection install
                want = "h" if self.db.get(name, {}).get("want") == "h" else "i"
                self.db[name] = {"want": want, "state": "i", "version": version or "1"}
            self.changed = True
            paths = [a.removeprefix("DPkg::Path=") for a in argv if a.startswith("DPkg::Path=")]
            env = {**os.environ, "PATH": paths[-1] if paths else os.environ["PATH"]}
            for script in self.scripts:
                subprocess.run(script, env=env, check=True)
            return 0, "", ""
        if argv == ["dpkg", "--set-selections"]:
            self.data.append(data or "")
            for line in (data or "").splitlines():
                name, selection = line.split()
                self.db[name]["want"] = "h" if selection == "hold" else "i"
            self.changed = True
            return 0, "", ""
        raise AssertionError(f"unexpected command {argv}")


def call(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake: FakeDpkg,
    *,
    check: bool = False,
    **args: Any,
) -> dict[str, Any]:
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: fake(argv, **kw))
    params = {"package": "nvidia-kernel-dkms", "offered": {"nvidia-kernel-dkms": MADISON}, "pin": "535", **args}
    if check:
        params["_ansible_check_mode"] = True
        params["_ansible_diff"] = True
    with patch_module_args(params), pytest.raises(SystemExit):
        mod.main()
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def apt_runs(fake: FakeDpkg) -> list[list[str]]:
    return [c for c in fake.commands if c[:2] == ["apt-get", "install"]]


# --- query: what a role decides before anything changes ----------------------------------------
def test_the_branch_pin_picks_the_newest_offered_and_reads_a_held_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeDpkg()
    out = call(monkeypatch, capsys, fake, state="query", installed_package="nvidia-smi")
    assert out["target"] == {"version": NEWEST, "upstream": "535.309.01", "available": [NEWEST, "535.261.03-1"]}
    # nvidia-smi is held ("hi"): the driver the role installed and held is installed all the same.
    assert out["installed_version"] == NEWEST
    assert out["changed"] is False
    assert all(c[0] == "dpkg-query" for c in fake.commands)


def test_an_exact_pin_and_a_package_dpkg_knows_but_lacks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = call(monkeypatch, capsys, FakeDpkg(), state="query", pin="535.261.03", installed_package="nvidia-kernel-dkms")
    assert out["target"]["version"] == "535.261.03-1"
    assert out["installed_version"] == ""


def test_a_pin_apt_does_not_offer_is_left_to_the_role_to_refuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = call(monkeypatch, capsys, FakeDpkg(), state="query", pin="575")
    assert out["target"] == {"version": None, "upstream": None, "available": [NEWEST, "535.261.03-1"]}
    assert not out.get("failed")
    out = call(monkeypatch, capsys, FakeDpkg(), pin="575", packages=DRIVER)
    assert out["failed"]
    assert "no version of nvidia-kernel-dkms that apt offers matches 575" in out["msg"]
    assert NEWEST in out["msg"]


# --- present: install what dpkg lacks, then hold -----------------------------------------------
def test_what_dpkg_lacks_is_installed_and_the_driver_held(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeDpkg()
    out = call(monkeypatch, capsys, fake, packages=DRIVER, extra=[HEADERS])
    assert out["changed"] is True
    # libcuda1 and nvidia-smi are at the pin already; the module and the kernel's headers are not
    assert out["install"] == [f"nvidia-kernel-dkms={NEWEST}", HEADERS]
    (apt,) = apt_runs(fake)
    assert apt[-2:] == [f"nvidia-kernel-dkms={NEWEST}", HEADERS]
    assert {"--no-install-recommends", "--allow-change-held-packages", "--allow-downgrades"} <= set(apt)
    assert "--simulate" not in apt
    # nvidia-smi was held already; the headers are never held
    assert out["held"] == ["nvidia-kernel-dkms", "libcuda1"]
    assert fake.data == ["nvidia-kernel-dkms hold\nlibcuda1 hold\n"]
    assert {n: e["want"] for n, e in fake.db.items() if n in DRIVER} == dict.fromkeys(DRIVER, "h")


def test_a_second_run_changes_nothing_and_runs_no_apt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeDpkg()
    call(monkeypatch, capsys, fake, packages=DRIVER, extra=[HEADERS])
    fake.commands.clear()
    out = call(monkeypatch, capsys, fake, packages=DRIVER, extra=[HEADERS])
    assert out["changed"] is False
    assert out["install"] == []
    assert out["held"] == []
    assert [c[0] for c in fake.commands] == ["dpkg-query"]


def test_check_mode_simulates_the_install_and_shows_the_change(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeDpkg()
    out = call(monkeypatch, capsys, fake, check=True, packages=DRIVER, extra=[HEADERS])
    assert out["changed"] is True
    (apt,) = apt_runs(fake)
    assert "--simulate" in apt
    assert fake.data == []  # no selection set
    assert not fake.changed
    before, after = out["diff"]["before"].splitlines(), out["diff"]["after"].splitlines()
    assert "nvidia-kernel-dkms (not installed) install" in before
    assert f"nvidia-kernel-dkms {NEWEST} hold" in after
    assert f"nvidia-smi {NEWEST} hold" in before
    assert f"{HEADERS} (not installed) install" in before
    assert f"{HEADERS} (newest) install" in after


def test_a_failed_install_says_what_apt_said_and_holds_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeDpkg(apt_fails="E: Unable to locate package linux-headers-6.1.0-50-amd64")
    out = call(monkeypatch, capsys, fake, packages=DRIVER, extra=[HEADERS])
    assert out["failed"]
    assert "Unable to locate package linux-headers-6.1.0-50-amd64" in out["msg"]
    assert fake.data == []


def test_the_branch_pinning_package_is_installed_and_held_only_where_apt_offers_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pinning = "nvidia-driver-pinning-535"
    fake = FakeDpkg()
    out = call(monkeypatch, capsys, fake, packages=DRIVER, companions=[pinning])
    assert pinning not in out["install"]
    assert pinning not in out["held"]
    offered = {"nvidia-kernel-dkms": MADISON, pinning: f"{pinning} | 535.309.01-1 | https://mirror/ Packages\n"}
    fake = FakeDpkg()
    out = call(monkeypatch, capsys, fake, packages=DRIVER, companions=[pinning], offered=offered)
    assert pinning in out["install"]  # unversioned: the repository's one for the branch
    assert pinning in out["held"]


def test_hold_false_releases_the_holds(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeDpkg()
    call(monkeypatch, capsys, fake, packages=DRIVER)
    out = call(monkeypatch, capsys, fake, packages=DRIVER, hold=False)
    assert out["changed"] is True
    assert out["held"] == DRIVER
    assert fake.data[-1] == "".join(f"{name} install\n" for name in DRIVER)
    assert call(monkeypatch, capsys, fake, packages=DRIVER, hold=False)["changed"] is False


# --- the initramfs updates the packages ask for, held until the install is done -----------------
def fake_update_initramfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An update-initramfs first on PATH that appends its arguments to the file it returns."""
    bin_dir, ran = tmp_path / "sbin", tmp_path / "ran"
    bin_dir.mkdir()
    real = bin_dir / "update-initramfs"
    real.write_text(f'#!/bin/sh\necho "$@" >> {ran}\n')
    real.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return ran


def test_the_packages_updates_of_the_initramfs_are_held_and_marked_a_kernels_own_image_is_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran = fake_update_initramfs(monkeypatch, tmp_path)
    marker = tmp_path / "state" / "initramfs-pending"  # its directory is created
    # initramfs-tools' trigger, three times as Debian's driver packages activate it, and a kernel's postinst.
    update, create = ["update-initramfs", "-u"], ["update-initramfs", "-c", "-k", "6.1.0-50-amd64"]
    scripts = (update, update, create)
    fake = FakeDpkg(scripts=scripts)
    out = call(monkeypatch, capsys, fake, packages=DRIVER, initramfs_marker=str(marker))
    assert out["initramfs_pending"] is True
    assert marker.exists()
    assert ran.read_text() == "-c -k 6.1.0-50-amd64\n"  # only the new kernel's image was made
    assert not [p for p in marker.parent.iterdir() if p != marker]  # the shim's directory is gone
    # A later run with nothing to install still reports the update pending until the role makes it.
    assert call(monkeypatch, capsys, fake, packages=DRIVER, initramfs_marker=str(marker))["initramfs_pending"]
    marker.unlink()
    assert call(monkeypatch, capsys, fake, packages=DRIVER, initramfs_marker=str(marker))["initramfs_pending"] is False


def test_without_a_marker_the_updates_run_as_asked_and_nothing_is_held_without_the_tool_or_in_check_mode(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran = fake_update_initramfs(monkeypatch, tmp_path)
    out = call(monkeypatch, capsys, FakeDpkg(scripts=(["update-initramfs", "-u"],)), packages=DRIVER)
    assert out["initramfs_pending"] is False
    assert ran.read_text() == "-u\n"
    with mod.initramfs_held(None) as options:
        assert options == []
    with mod.initramfs_held(str(tmp_path / "m")) as options:
        assert options[0] == "-o"
        assert Path(options[1].removeprefix("DPkg::Path=").split(":")[0], "update-initramfs").exists()
    # Check mode, where update-initramfs is there to hold: apt only simulates, with apt's own path.
    fake = FakeDpkg()
    out = call(monkeypatch, capsys, fake, packages=DRIVER, initramfs_marker=str(tmp_path / "m"), check=True)
    assert out["initramfs_pending"] is False
    (apt,) = apt_runs(fake)
    assert "--simulate" in apt
    assert not [a for a in apt if a.startswith("DPkg::Path=")]
    # A host without update-initramfs (dracut's): nothing to hold.
    monkeypatch.setattr(mod.shutil, "which", lambda *_, **__: None)
    with mod.initramfs_held(str(tmp_path / "m")) as options:
        assert options == []
