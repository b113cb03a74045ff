#!/usr/bin/python
"""Ansible module gpuenv_apt_index: an apt package index that matches the host's sources, and what
it offers for the packages a role is about to choose from."""

from __future__ import annotations

import glob
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_hostparse import madison_from

DOCUMENTATION = r"""
module: gpuenv_apt_index
short_description: Refresh apt's index when it no longer matches the sources, and list what it offers
description:
  - apt judges its index by age alone, so a component, suite or repository added less than
    I(cache_valid_time) ago goes unseen (Debian's non-free just enabled, NVIDIA's repository just
    added). This module refreshes when an index file the sources name is missing, when a sources
    file changed after the last refresh, or when the last refresh is older than I(cache_valid_time).
  - It then asks C(apt-cache madison) for each of I(packages). A package that nothing offers
    triggers one more refresh (unless this run already refreshed) before the answer.
  - For each package still missing, I(why) says what is really missing, read from the host's
    sources through C(apt-get indextargets) - the component, the repository, or the package.
  - Reports changed only when it writes apt's retry setting (I(retries)); the index is not the
    host's configuration. Refreshes in check mode too, because the roles' check mode decides from
    the index as a real run does.
options:
  packages:
    description: Package names to look up.
    type: list
    elements: str
    required: true
  optional:
    description:
      - Package names to look up as well, whose absence is no reason to refresh (a package only
        some repositories have).
    type: list
    elements: str
    default: []
  cache_valid_time:
    description: Refresh when the last refresh is older than this many seconds (0 refreshes every run).
    type: int
    default: 3600
  component:
    description:
      - The archive component these packages live in (C(non-free) for Debian's NVIDIA packages),
        to name it when the sources lack it.
    type: str
  lock_timeout:
    description: Seconds to wait for apt's lock (held by apt-daily or another apt) before failing.
    type: int
    default: 120
  retries:
    description:
      - How many more times apt tries a download that failed (a dropped link, a server error), for
        the refresh here and for every package download after it, written to
        C(/etc/apt/apt.conf.d/80gpuenv-retries) (C(Acquire::Retries); apt waits longer before each
        try). 0 leaves apt's own setting alone. The only change this module makes to the host.
    type: int
    default: 3
  repository:
    description:
      - The URL of the repository that should offer them (NVIDIA's or a site mirror), to name it
        when the sources lack it.
    type: str
  only_repository:
    description:
      - List only the versions I(repository) offers, not those of other repositories with the same
        package names (Debian's own nvidia-driver beside NVIDIA's, at a higher version on Debian 13),
        so that what a pin picks comes from that repository. A package it does not offer is missing.
    type: bool
    default: false
"""

RETURN = r"""
changed:
  description: Whether apt's retry setting (C(retries)) was written; the index itself is no change.
  type: bool
madison:
  description: C(apt-cache madison) output per package (empty when nothing offers it); parse with gpuenv_driver_pick.
  type: dict
missing:
  description: The packages (of I(packages)) no configured repository offers.
  type: list
why:
  description: Per missing package, one sentence on what the sources lack and how to fix it.
  type: dict
refreshed:
  description: Why the index was refreshed in this run, or an empty list when it was current.
  type: list
sources:
  description: The repositories the sources name, as "URI suite/component".
  type: list
"""

# apt's retries for package downloads, which Ansible's apt module cannot pass on the command line.
RETRIES_CONF = "/etc/apt/apt.conf.d/80gpuenv-retries"

# The module's own record of when it last refreshed: apt's lists keep the servers' times, not ours.
STAMP = "/var/lib/apt/periodic/gpuenv-update-stamp"
# Written by apt.systemd.daily and Ubuntu's update-notifier after their own successful updates.
APT_STAMP = "/var/lib/apt/periodic/update-success-stamp"
LISTS = "/var/lib/apt/lists"
SOURCES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources")
# FILENAME is where apt keeps (or would keep) the index; the rest names the repository and the
# sources line. --no-release-info lists the targets of repositories never fetched too. An "all"
# architecture index is optional (apt's record says so; its --format has no field for it).
TARGET_FIELDS = ("IDENTIFIER", "FILENAME", "REPO_URI", "RELEASE", "COMPONENT", "ARCHITECTURE", "SOURCESENTRY")
TARGET_FORMAT = "\t".join(f"$({name})" for name in TARGET_FIELDS)


def parse_indextargets(text: str) -> list[dict[str, str]]:
    """`apt-get indextargets --no-release-info --format TARGET_FORMAT` lines, Packages indexes
    only. apt prints a field a target lacks (a flat repository's component) as "$(NAME)"."""
    targets = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != len(TARGET_FIELDS) or fields[0] != "Packages":
            continue
        values = ["" if v == f"$({name})" else v for name, v in zip(TARGET_FIELDS, fields, strict=True)]
        keys = ("identifier", "filename", "uri", "suite", "component", "arch", "entry")
        targets.append(dict(zip(keys, values, strict=True)))
    return targets


def _repo(target: dict[str, str]) -> str:
    """ "URI suite/component" as apt prints it; a flat repository is its URI alone."""
    where = "/".join(x for x in (target["suite"], target["component"]) if x)
    return f"{target['uri']} {where}".strip()


def index_present(filename: str) -> bool:
    """apt names an existing index with its compression suffix (.lz4, .gz) and a missing one without."""
    return os.path.exists(filename) or bool(glob.glob(glob.escape(filename) + ".*"))


def unfetchable() -> set[str]:
    """Index files the last refresh could not fetch (a foreign architecture or a component the
    mirror does not carry): no reason to refresh again until the sources change."""
    try:
        with open(STAMP) as stamp:
            return set(json.load(stamp).get("unfetchable", []))
    except (OSError, ValueError, AttributeError):
        return set()


def last_refresh() -> float:
    """When the index was last refreshed: the newest of our stamp and apt's, else when the lists
    directory last changed (what Ansible's apt module reads), else never."""
    times = [os.stat(p).st_mtime for p in (STAMP, APT_STAMP) if os.path.exists(p)]
    if not times and os.path.isdir(LISTS):
        times.append(os.stat(LISTS).st_mtime)
    return max(times, default=0.0)


def sources_mtime() -> tuple[float, str]:
    newest, path = 0.0, ""
    for pattern in SOURCES:
        for name in glob.glob(pattern):
            mtime = os.stat(name).st_mtime
            if mtime > newest:
                newest, path = mtime, name
    return newest, path


def missing_indexes(targets: list[dict[str, str]]) -> list[dict[str, str]]:
    return [t for t in targets if t["arch"] != "all" and not index_present(t["filename"])]


def refresh_reasons(targets: list[dict[str, str]], cache_valid_time: int, now: float) -> list[str]:
    reasons = []
    refreshed = last_refresh()
    changed_at, changed_file = sources_mtime()
    sources_changed = changed_at > refreshed
    skip = set() if sources_changed else unfetchable()
    missing = sorted({_repo(t) for t in missing_indexes(targets) if t["filename"] not in skip})
    if missing:
        reasons.append("no index yet for " + ", ".join(missing))
    if sources_changed:
        reasons.append(f"{changed_file} changed after the last refresh")
    if now - refreshed >= cache_valid_time:
        reasons.append(f"the index is older than {cache_valid_time} s")
    return reasons


def explain(package: str, targets: list[dict[str, str]], component: str | None, repository: str | None) -> str:
    """What the sources lack for a package nothing offers, from the repositories they name."""
    listed = sorted({_repo(t) for t in targets})
    where = "; ".join(listed) or "none"
    if repository and not any(t["uri"].rstrip("/") == repository.rstrip("/") for t in targets):
        return (
            f"{package} is not offered: the apt sources do not include the repository {repository} "
            f"(they name: {where}). Add it (or a site mirror of it) to /etc/apt/sources.list.d/."
        )
    if component and not any(t["component"] == component for t in targets):
        entries = sorted({t["entry"].rsplit(":", 1)[0] for t in targets if t["entry"]})
        suites = sorted({f"{t['uri']} {t['suite']}" for t in targets if t["suite"]})
        return (
            f"{package} is in the '{component}' component, which the apt sources do not enable for "
            f"{', '.join(suites) or 'any suite'}. Add '{component}' to the components of those sources "
            f"({', '.join(entries) or '/etc/apt/sources.list'}), then rerun."
        )
    return (
        f"{package} is not offered by any repository in the apt sources, even after a refresh (searched: {where}). "
        f"Add a repository or site mirror that carries it."
    )


def retries_conf(retries: int) -> str:
    return (
        "// Written by gpuenv (gpuenv_apt_index): a dropped link or a server error during a download is\n"
        f'// tried again, apt waiting longer before each try.\nAcquire::Retries "{retries}";\n'
    )


def ensure_retries(retries: int, check_mode: bool) -> bool:
    """Write apt's retry setting when it differs; True when it changed (or would, in check mode)."""
    if retries <= 0:
        return False
    want = retries_conf(retries)
    try:
        with open(RETRIES_CONF) as conf:
            if conf.read() == want:
                return False
    except OSError:
        pass
    if not check_mode:
        tmp = RETRIES_CONF + ".tmp"
        with open(tmp, "w") as conf:
            conf.write(want)
        os.chmod(tmp, 0o644)
        os.replace(tmp, RETRIES_CONF)
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "required": True},
            "optional": {"type": "list", "elements": "str", "default": []},
            "cache_valid_time": {"type": "int", "default": 3600},
            "component": {"type": "str"},
            "repository": {"type": "str"},
            "only_repository": {"type": "bool", "default": False},
            "lock_timeout": {"type": "int", "default": 120},
            "retries": {"type": "int", "default": 3},
        },
        supports_check_mode=True,
    )
    p = module.params
    changed = ensure_retries(p["retries"], module.check_mode)
    retries = ["-o", f"Acquire::Retries={max(p['retries'], 0)}"]

    def targets() -> list[dict[str, str]]:
        rc, out, err = module.run_command(["apt-get", "indextargets", "--no-release-info", "--format", TARGET_FORMAT])
        if rc != 0:
            module.fail_json(msg=f"apt-get indextargets failed (rc {rc}): {err.strip()}")
        return parse_indextargets(out)

    def refresh() -> None:
        # apt-daily or unattended-upgrades may hold apt's lock on a freshly booted host: wait for
        # it as Ansible's apt module does, rather than fail.
        deadline = time.time() + p["lock_timeout"]
        while True:
            rc, out, err = module.run_command(["apt-get", "update", "-q", *retries])
            if rc == 0 or "Could not get lock" not in (err + out) or time.time() >= deadline:
                break
            time.sleep(5)
        if rc != 0:
            module.fail_json(
                msg=f"apt-get update failed on this host (rc {rc}): {(err or out).strip()[-2000:]}. "
                "Check the apt sources and that their repositories are reachable.",
            )
        left = sorted(t["filename"] for t in missing_indexes(targets()))
        os.makedirs(os.path.dirname(STAMP), exist_ok=True)
        with open(STAMP, "w") as stamp:
            json.dump({"time": time.time(), "unfetchable": left}, stamp)

    def madison() -> dict[str, str]:
        found = {}
        for package in [*p["packages"], *p["optional"]]:
            rc, out, err = module.run_command(["apt-cache", "madison", package])
            if rc != 0:
                module.fail_json(msg=f"apt-cache madison {package} failed (rc {rc}): {err.strip()}")
            found[package] = madison_from(out, p["repository"]) if p["only_repository"] and p["repository"] else out
        return found

    listed = targets()
    reasons = refresh_reasons(listed, p["cache_valid_time"], time.time())
    if reasons:
        refresh()
    offered = madison()
    missing = [name for name in p["packages"] if not offered[name].strip()]
    if missing and not reasons:
        # The index looked current but lacks a package: a repository may have gained it since.
        reasons = [f"{', '.join(missing)} not in the index"]
        refresh()
        offered = madison()
        missing = [name for name in p["packages"] if not offered[name].strip()]
    if reasons:
        listed = targets()
    module.exit_json(
        changed=changed,
        madison=offered,
        missing=missing,
        why={name: explain(name, listed, p["component"], p["repository"]) for name in missing},
        refreshed=reasons,
        sources=sorted({_repo(t) for t in listed}),
    )


if __name__ == "__main__":
    main()
