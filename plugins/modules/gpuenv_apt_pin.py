#!/usr/bin/python
"""Ansible module gpuenv_apt_pin: the version of a package family that a pin names, installed and
held; the driver role's pin-and-hold in one step instead of a chain of tasks."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_hostparse import (
    DPKG_QUERY_FORMAT,
    dpkg_unheld,
    dpkg_unsatisfied,
    parse_dpkg_query,
    pin_choice,
)

DOCUMENTATION = r"""
module: gpuenv_apt_pin
short_description: Install packages at the version a pin names, from what apt offers, and hold them
description:
  - Picks the newest version of I(package) that matches I(pin), a branch (C(550)) or an exact
    upstream version (C(550.163.01)), from the versions apt offers (I(offered), as the
    gpuenv_apt_index module returns them).
  - With I(state=present), installs what dpkg lacks of I(packages) at that version, of I(extra) at
    any version (kernel headers), and of I(companions) that apt offers (NVIDIA's branch pinning
    package); then holds I(packages) and those companions (C(dpkg --set-selections)), or with
    I(hold=false) releases their holds. A re-run with nothing to change runs no apt at all.
  - With I(state=query), changes nothing and reports the version the pin names (C(target.version)
    is null when apt offers none, for the caller to refuse in its own words) and which version of
    I(installed_package) is installed, held or not - what a role decides before any change.
  - In check mode C(apt-get install --simulate) stands in for the install (it fails where the real
    install would), and the diff shows each package's version and selection before and after.
options:
  package:
    description: The package whose offered versions the pin picks from (the driver's main package).
    type: str
    required: true
  offered:
    description:
      - C(apt-cache madison) output per package name (gpuenv_apt_index's C(madison)); must hold
        I(package), and names the I(companions) apt offers.
    type: dict
    required: true
  pin:
    description: A branch (C(550)) or an exact upstream version (C(550.163.01)).
    type: str
    required: true
  packages:
    description: Installed at the version the pin picks, and held.
    type: list
    elements: str
    default: []
  companions:
    description:
      - Installed at any version and held, where I(offered) lists them (NVIDIA's
        nvidia-driver-pinning-<branch>, which only its repository has); skipped where it does not.
    type: list
    elements: str
    default: []
  extra:
    description: Installed at any version and never held (the headers of each installed kernel).
    type: list
    elements: str
    default: []
  installed_package:
    description:
      - With I(state=query), the package (or dpkg-query pattern) whose installed version to report
        in C(installed_version).
    type: str
  hold:
    description: With I(state=present), hold the packages (true) or release their holds (false).
    type: bool
    default: true
  state:
    description: C(present) installs and holds; C(query) reads only.
    type: str
    choices: [present, query]
    default: present
  lock_timeout:
    description: Seconds apt waits for dpkg's lock (held by apt-daily or unattended-upgrades).
    type: int
    default: 120
  initramfs_marker:
    description:
      - Hold the initramfs updates (C(update-initramfs -u)) that the packages ask for during the
        install, and create this file instead, for the caller to update it once afterwards and then
        remove the file. Debian's driver packages ask three times (initramfs-tools' trigger, run
        after each batch apt configures), 13-20 s each. The file outlives a run that dies before the
        update; C(initramfs_pending) reports it. C(update-initramfs -c) and C(-d) (a kernel's own
        image) still run at once. Unset, nothing is held.
    type: path
"""

EXAMPLES = r"""
- name: Choose the driver version the pin names, and read the installed one
  gpuenv_apt_pin:
    package: nvidia-kernel-dkms
    offered: "{{ nvidia_driver_register_index.madison }}"
    pin: "535"
    installed_package: libcuda1
    state: query
  register: nvidia_driver_register_pin

- name: Install the driver at that version, and headers for every kernel; hold it
  gpuenv_apt_pin:
    package: nvidia-kernel-dkms
    offered: "{{ nvidia_driver_register_index.madison }}"
    pin: "535"
    packages: [nvidia-kernel-dkms, nvidia-smi, libcuda1]
    extra: [linux-headers-6.1.0-40-amd64]
"""

RETURN = r"""
target:
  description:
    - The choice, as the gpuenv_driver_pick filter gives it - C(version) (the Debian version, null
      when no offered version matches), C(upstream) and C(available) (every version offered, newest
      first).
  type: dict
installed_version:
  description: With I(state=query), the installed version of I(installed_package) ("" when none).
  type: str
install:
  description: What apt was asked to install ("pkg=version" or "pkg"); empty when dpkg had it all.
  type: list
held:
  description: The packages whose selection became hold (with I(hold=false), install).
  type: list
initramfs_pending:
  description:
    - Whether I(initramfs_marker) exists after the run - an update this install held, or one an
      earlier run held and never made. False when I(initramfs_marker) is unset.
  type: bool
"""


class PinError(Exception):
    """What is wrong, and how to fix it: the module's failure message."""


def dpkg_status(module: Any, names: list[str]) -> dict[str, dict[str, str]]:
    """dpkg's view of the named packages; rc 1 means some are unknown to dpkg yet, which is an answer."""
    if not names:
        return {}
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f", DPKG_QUERY_FORMAT, *names])
    if rc not in (0, 1):
        raise PinError(f"dpkg-query failed (rc {rc}): {err.strip()}")
    status: dict[str, dict[str, str]] = parse_dpkg_query(out)
    return status


def installed_version(status: dict[str, dict[str, str]]) -> str:
    """The version of the first installed package: a held one counts (Status-Abbrev "hi"), since the
    role holds the driver it installed."""
    return next((entry["version"] for entry in status.values() if entry["state"] == "i"), "")


def describe(status: dict[str, dict[str, str]], names: list[str]) -> str:
    """One line per package, "name version selection", for the diff."""
    lines = []
    for name in names:
        entry = status.get(name, {})
        version = entry.get("version") if entry.get("state") == "i" else "(not installed)"
        lines.append(f"{name} {version} {'hold' if entry.get('want') == 'h' else 'install'}")
    return "\n".join(lines) + "\n"


# The stand-in update-initramfs that dpkg's scripts find first on PATH: an update (-u, what
# initramfs-tools' trigger and the packages' scripts run) only creates the marker; anything else
# (-c, -d: a kernel's own image) runs the real one. Where the marker cannot be written, the real
# update runs: nothing is held that is not recorded.
INITRAMFS_SHIM = """#!/bin/sh
for arg in "$@"; do
    if [ "$arg" = -u ] && mkdir -p {marker_dir} && : > {marker}; then
        echo "update-initramfs: held until the install is done ({marker} records it)"
        exit 0
    fi
done
exec {real} "$@"
"""


# apt runs dpkg with PATH set to its DPkg::Path, this by default (apt-pkg's dpkgpm.cc), whatever
# its own PATH is.
DPKG_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@contextmanager
def initramfs_held(marker: str | None) -> Iterator[list[str]]:
    """apt's options under which update-initramfs -u only creates MARKER: DPkg::Path with a
    directory holding INITRAMFS_SHIM first, removed afterwards. Empty where nothing is to be held (no
    MARKER, or no update-initramfs: a dracut host), or where the shim could not run: its directory
    sits beside the marker, not in /tmp, which hardened hosts mount noexec; where that is noexec too,
    the updates run as the packages ask."""
    # The real tool as the module's PATH finds it, else where dpkg's scripts would.
    real = shutil.which("update-initramfs", path=f"{os.environ.get('PATH', DPKG_PATH)}:{DPKG_PATH}")
    if not marker or real is None:
        yield []
        return
    marker_dir = os.path.dirname(marker)
    os.makedirs(marker_dir, mode=0o755, exist_ok=True)
    if os.statvfs(marker_dir).f_flag & os.ST_NOEXEC:
        yield []
        return
    # Private (0700); its user is root, as apt's scripts are. A job killed mid-install leaves it.
    with tempfile.TemporaryDirectory(prefix=".initramfs-shim-", dir=marker_dir) as shim_dir:
        shim = os.path.join(shim_dir, "update-initramfs")
        with open(shim, "w", encoding="utf-8") as f:
            q = shlex.quote
            f.write(INITRAMFS_SHIM.format(marker=q(marker), marker_dir=q(marker_dir), real=q(real)))
        os.chmod(shim, 0o700)
        yield ["-o", f"DPkg::Path={shim_dir}:{DPKG_PATH}"]


def apt_install(module: Any, names: list[str], lock_timeout: int, marker: str | None = None) -> None:
    """apt-get as Ansible's apt module runs it for these settings (no recommends, a downgrade and a
    held package allowed, the configuration files dpkg would ask about kept), or its simulation."""
    argv = [
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "--allow-change-held-packages",
        "--allow-downgrades",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        "-o",
        f"DPkg::Lock::Timeout={lock_timeout}",
    ]
    if module.check_mode:
        argv.append("--simulate")
    with initramfs_held(None if module.check_mode else marker) as held:
        rc, out, err = module.run_command(
            [*argv, *held, *names], environ_update={"DEBIAN_FRONTEND": "noninteractive", "DEBIAN_PRIORITY": "critical"}
        )
    if rc != 0:
        raise PinError(f"{' '.join(argv[:2])} {' '.join(names)} failed (rc {rc}): {(err or out).strip()[-2000:]}")


def set_selections(module: Any, names: list[str], selection: str) -> None:
    data = "".join(f"{name} {selection}\n" for name in names)
    # binary_data: the text goes to dpkg as it is (run_command would append a newline of its own).
    rc, _, err = module.run_command(["dpkg", "--set-selections"], data=data, binary_data=True)
    if rc != 0:
        raise PinError(f"dpkg --set-selections failed (rc {rc}): {err.strip()}")


def run(module: Any, p: dict[str, Any]) -> dict[str, Any]:
    target = pin_choice(str((p["offered"] or {}).get(p["package"]) or ""), p["pin"])
    if p["state"] == "query":
        status = dpkg_status(module, [p["installed_package"]] if p.get("installed_package") else [])
        return {"changed": False, "target": target, "installed_version": installed_version(status)}
    if target["version"] is None:
        raise PinError(
            f"no version of {p['package']} that apt offers matches {p['pin']} "
            f"(offered: {', '.join(target['available']) or 'none'}); nothing was changed. Pin one of the "
            "offered versions or branches, or add a repository (or site mirror) that has this one"
        )
    offered = p["offered"] or {}
    companions = [name for name in p["companions"] if str(offered.get(name) or "").strip()]
    managed = [*p["packages"], *companions]
    shown = [*managed, *p["extra"]]
    wanted = [f"{name}={target['version']}" for name in p["packages"]] + companions + p["extra"]
    before = dpkg_status(module, shown)
    install = dpkg_unsatisfied(before, wanted)
    after = before
    if install:
        apt_install(module, install, p["lock_timeout"], p["initramfs_marker"])
        if not module.check_mode:
            # Read again: what apt installed, and the selections of packages new to dpkg (not held yet).
            after = dpkg_status(module, shown)
            lacking = dpkg_unsatisfied(after, wanted)
            if lacking:
                raise PinError(f"apt-get reported success, but dpkg does not have {', '.join(lacking)}")
    selection = "hold" if p["hold"] else "install"
    if p["hold"]:
        # In check mode a package apt would install is not in dpkg yet: it would be held too.
        change = dpkg_unheld(after, managed)
    else:
        change = [name for name in managed if after.get(name, {}).get("want") == "h"]
    if change and not module.check_mode:
        set_selections(module, change, selection)
    planned = {
        name: {
            "state": "i",
            "version": target["version"] if name in p["packages"] else after.get(name, {}).get("version") or "(newest)",
            "want": ("h" if p["hold"] else "i") if name in managed else after.get(name, {}).get("want", "i"),
        }
        for name in shown
    }
    return {
        "changed": bool(install or change),
        "target": target,
        "install": install,
        "held": change,
        "diff": {"before": describe(before, shown), "after": describe(planned, shown)},
        "initramfs_pending": bool(p["initramfs_marker"]) and os.path.exists(p["initramfs_marker"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "package": {"type": "str", "required": True},
            "offered": {"type": "dict", "required": True},
            "pin": {"type": "str", "required": True},
            "packages": {"type": "list", "elements": "str", "default": []},
            "companions": {"type": "list", "elements": "str", "default": []},
            "extra": {"type": "list", "elements": "str", "default": []},
            "installed_package": {"type": "str"},
            "hold": {"type": "bool", "default": True},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            "lock_timeout": {"type": "int", "default": 120},
            "initramfs_marker": {"type": "path"},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module, module.params)
    except PinError as exc:
        module.fail_json(msg=f"{module.params['package']} {module.params['pin']}: {exc}")
        raise  # fail_json exits; this line is for the type checker
    module.exit_json(**result)


if __name__ == "__main__":
    main()
