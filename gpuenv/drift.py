"""What differs on a host from the stack the inventory declares: `gpuenv verify --drift`, which
playbooks/drift.yml runs on each host.

The inputs are what the host says of itself, read without changing anything (observe): the host's
record of its stack (/etc/gpuenv/stack.json) and the records the roles wrote (/etc/ansible/facts.d),
where /usr/local/cuda and the environment's stable path really point, `pip freeze` of the
environment against its lock, dpkg's state of the packages the records name, systemd's state of the
daemons gpu_services set up, and (from drift.yml) gpuenv_converged's comparison of the places
site.yml writes with the stamp of the last complete run. The output is checks in gpuenv verify's
report model (gpuenv.verify.model; ids `drift.*`), in the same report as verify's own checks.
Runs on the host inside verify's zipapp: the standard library only, Python 3.8's syntax.
Tested in tests/test_drift.py.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify.model import Check

if TYPE_CHECKING:
    from collections.abc import Callable

# The host's record of its stack (role stack_record; Ansible reads it as the local fact gpuenv) and
# the folder of the roles' own records (ansible_local).
RECORD = "/etc/gpuenv/stack.json"
FACTS_DIR = "/etc/ansible/facts.d"

HINT = "run playbooks/site.yml to put the declared stack back, or declare what the host has"


def _check(check_id: str, ok: bool, summary: str, observed: Any, expected: Any, *, hint: str = HINT) -> Check:
    return Check.judged(check_id, ok, summary, observed, expected, hint)


def _xy(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


# pip, setuptools and wheel come with the venv and are not in the lock.
_TOOLING = {"pip", "setuptools", "wheel"}


def lock_differences(lock: str, freeze: str) -> dict[str, list[str]]:
    """What an environment holds (`pip freeze --all`) beyond, short of or other than its lock:
    {added: ["name==version"], missing: [...], changed: ["name: locked -> found"]}. drift reports it;
    the pytorch_env role puts an environment that differs back to its lock."""
    locked, frozen = hostparse.parse_lock(lock), hostparse.parse_freeze(freeze)
    return {
        "added": sorted(f"{n}=={v}" for n, v in frozen.items() if n not in locked and n not in _TOOLING),
        "missing": sorted(f"{n}=={v}" for n, v in locked.items() if n not in frozen),
        "changed": sorted(f"{n}: {locked[n]} -> {v}" for n, v in frozen.items() if n in locked and locked[n] != v),
    }


# The daemons gpu_services enables (its record's keys), with the unit each runs as.
SERVICE_UNITS = {"persistenced": "nvidia-persistenced", "fabricmanager": "nvidia-fabricmanager"}


def wanted_services(record: Any) -> dict[str, str]:
    """{key: unit} of the daemons gpu_services set up (its record, gpu_services.fact, says wanted)."""
    if not isinstance(record, Mapping):
        return {}
    return {
        key: str(record[key].get("unit") or unit)
        for key, unit in SERVICE_UNITS.items()
        if isinstance(record.get(key), Mapping) and record[key].get("wanted")
    }


def service_checks(record: Any, units: Mapping[str, Mapping[str, str]] | None) -> list[Check]:
    """drift.<service> for each daemon gpu_services set up (its record, gpu_services.fact, says
    wanted): its unit must exist and be enabled, as `systemctl show` reports it
    (hostparse.parse_systemctl_show). A removed package leaves no unit: missing. A unit that is
    enabled but whose last start failed is as gpu_services left it (the sandbox's daemons fail
    without a GPU); the summary says so, and verify's services checks judge the daemon itself."""
    checks: list[Check] = []
    for key, unit in wanted_services(record).items():
        entry = record[key]
        live = (units or {}).get(f"{unit}.service") or {}
        loaded = live.get("LoadState") not in (None, "", "not-found")
        status = (live.get("UnitFileState") or "unknown") if loaded else "missing"
        ok = status == "enabled"
        state = "missing (no unit: its package was removed?)" if status == "missing" else status
        failed = " (its last start failed: journalctl -u " + unit + ")" if live.get("ActiveState") == "failed" else ""
        checks.append(
            _check(
                f"drift.{key}",
                ok,
                f"{unit} is enabled{failed}"
                if ok
                else f"{unit} is {state}, though gpu_services set it up ({entry.get('why', '')})",
                status,
                "enabled",
                hint=f"systemctl enable --now {unit}, or run playbooks/site.yml (stage gpu_services) to install and "
                "enable it again; set gpu_services_" + key + ": off where the host should not run it",
            )
        )
    return checks


def recorded_packages(facts: Mapping[str, Any]) -> dict[str, str]:
    """{package: version} of the packages the roles installed from NVIDIA's repository and hold, as
    their records name them (cudnn's libcudnn9-cuda-12, cuda_toolkit's cuda-toolkit-12-4)."""
    recorded: dict[str, str] = {}
    for role in ("cudnn", "cuda_toolkit"):
        record = facts.get(role) or {}
        packages = record.get("packages") if isinstance(record, Mapping) else None
        if isinstance(packages, Mapping):
            recorded.update({str(k): str(v) for k, v in packages.items()})
    return recorded


def package_checks(facts: Mapping[str, Any], dpkg: Mapping[str, Any] | None) -> list[Check]:
    """drift.packages: the packages the records name (recorded_packages) against dpkg's state
    (hostparse.parse_dpkg_query): still installed, at that version, held. An `apt-mark unhold` and
    an `apt install libcudnn9-cuda-12=<newer>` by hand are what it sees. None: dpkg was not read."""
    recorded = recorded_packages(facts)
    if not recorded or dpkg is None:
        return []
    problems = []
    for name, version in sorted(recorded.items()):
        have = dpkg.get(name) or {}
        if have.get("state") != "i":
            problems.append(f"{name} is not installed (gpuenv installed {version})")
            continue
        if have.get("version") != version:
            problems.append(f"{name} is {have.get('version')}, not {version}: changed behind gpuenv's back")
        if have.get("want") != "h":
            problems.append(f"{name} is not held any more")
    return [
        _check(
            "drift.packages",
            not problems,
            f"NVIDIA's packages as gpuenv installed and held them ({', '.join(sorted(recorded))})"
            if not problems
            else "NVIDIA's packages changed since gpuenv installed them: " + "; ".join(problems),
            problems or sorted(f"{n}={v}" for n, v in recorded.items()),
            sorted(f"{n}={v} (held)" for n, v in recorded.items()),
            hint="someone upgraded or unheld a package gpuenv holds; run playbooks/site.yml, which installs "
            "the declared version again and holds it (apt-mark showhold lists the holds)",
        )
    ]


def since_last_run(converged: Mapping[str, Any] | None) -> list[Check]:
    """drift.since_last_run: the places gpuenv writes (package database, apt pins, modprobe and
    loader settings, profile scripts, the trees and environments, the records, the daemons' states)
    against the stamp of the host's last complete site.yml run (the gpuenv_converged module, in
    check mode). What no other check reads (a hold taken off, a pin file or the nouveau blacklist
    removed, a profile script gone, the environment's group changed) is seen here. No stamp (a
    host site.yml never finished on, or one whose stamp a run cleared): nothing to compare."""
    if not converged or converged.get("why", "").startswith("no stamp"):
        return [
            Check("drift.since_last_run", "skip", "no stamp of a complete site.yml run on the host to compare with")
        ]
    places = [p.split(":", 1)[-1] for p in converged.get("differs", []) if p != "inputs"]
    return [
        _check(
            "drift.since_last_run",
            not places,
            "nothing gpuenv wrote changed since its last complete run"
            if not places
            else "changed since the last complete run of site.yml: " + ", ".join(places),
            places,
            "the host as its last complete run left it",
            hint="something other than gpuenv changed what it installed there; run playbooks/site.yml, which "
            "sees the change and runs every stage to put the host back",
        )
    ]


def _toolkit_checks(want_cuda: str, toolkit: Mapping[str, Any], cuda_link: str | None) -> list[Check]:
    """drift.cuda_default and drift.cuda_installed: /usr/local/cuda and the record against the
    declared toolkit."""
    found: list[Check] = []
    live = cuda_link or ""
    live_xy = live.rsplit("cuda-", 1)[1] if "cuda-" in live else ""
    ok = live_xy == _xy(want_cuda)
    found.append(
        _check(
            "drift.cuda_default",
            ok,
            f"/usr/local/cuda points at {live or 'nothing'}" + ("" if ok else f", not CUDA {_xy(want_cuda)}"),
            live or None,
            f"/usr/local/cuda-{_xy(want_cuda)}",
            hint="someone repointed /usr/local/cuda by hand; " + HINT,
        )
    )
    installed = [str(v) for v in toolkit.get("versions") or []]
    found.append(
        _check(
            "drift.cuda_installed",
            want_cuda in installed,
            f"CUDA {want_cuda} is installed" if want_cuda in installed else f"CUDA {want_cuda} is not recorded",
            installed,
            want_cuda,
        )
    )
    return found


def compare(
    resolved: dict[str, Any],
    facts: dict[str, Any],
    *,
    cuda_link: str | None,
    env_link: str | None,
    lock: str | None,
    freeze: str | None,
    services: Mapping[str, Any] | None = None,
    converged: Mapping[str, Any] | None = None,
    dpkg: Mapping[str, Any] | None = None,
) -> list[Check]:
    """The drift checks of one host: its records and what is live, against the declared stack.
    services: `systemctl show` of the daemons gpu_services recorded (service_checks); dpkg: dpkg's
    state of the packages the records name (package_checks); lock and freeze: the environment's
    lock and `pip freeze --all` (no check without both)."""
    checks: list[Check] = []
    record = facts.get("gpuenv") or {}
    recorded = (record.get("resolved") or {}) if isinstance(record, dict) else {}
    keys = ("driver", "cuda", "cudnn", "python", "torch", "torch_variant")
    declared_stack = {k: resolved.get(k) for k in keys}
    recorded_stack = {k: recorded.get(k) for k in keys}
    checks.append(
        _check(
            "drift.record",
            declared_stack == recorded_stack,
            "the host was provisioned for the declared stack"
            if declared_stack == recorded_stack
            else "the host was provisioned for another stack than the inventory declares",
            recorded_stack if record else "no gpuenv record on the host",
            declared_stack,
        )
    )

    driver = facts.get("nvidia_driver") or {}
    want = str(resolved.get("driver", ""))
    have = str(driver.get("version") or "")
    ok = bool(have) and (have == want or have.startswith(want + "."))
    checks.append(
        _check("drift.driver", ok, f"driver {have or 'not recorded'} for the declared {want}", have or None, want)
    )

    toolkit = facts.get("cuda_toolkit") or {}
    want_cuda = str(resolved.get("cuda", ""))
    if want_cuda == "none":
        why = "the stack declares no CUDA toolkit (torch's wheels bring their own CUDA runtime)"
        checks += [Check("drift.cuda_default", "skip", why), Check("drift.cuda_installed", "skip", why)]
    else:
        checks += _toolkit_checks(want_cuda, toolkit, cuda_link)

    cudnn = facts.get("cudnn") or {}
    want_cudnn = str(resolved.get("cudnn", ""))
    have_cudnn = str(cudnn.get("version") or "")
    checks.append(
        _check(
            "drift.cudnn",
            have_cudnn == want_cudnn,
            f"system cuDNN {have_cudnn or 'not recorded'} for the declared {want_cudnn}",
            have_cudnn or None,
            want_cudnn,
        )
    )

    env = facts.get("pytorch_env") or {}
    want_torch = f"{resolved.get('torch')}+{resolved.get('torch_variant')}"
    have_torch = f"{env.get('torch')}+{env.get('variant')}" if env else ""
    checks.append(
        _check(
            "drift.env_torch",
            have_torch == want_torch,
            f"environment torch {have_torch or 'not recorded'} for the declared {want_torch}",
            have_torch or None,
            want_torch,
        )
    )
    active = str(env.get("active") or "")
    ok = bool(active) and env_link == active
    checks.append(
        _check(
            "drift.env_active",
            ok,
            f"{env.get('path', 'the environment')} points at the environment gpuenv built"
            if ok
            else f"{env.get('path', 'the environment')} points at {env_link or 'nothing'}, not {active or '?'}",
            env_link,
            active or None,
            hint="the environment's stable path was repointed by hand; " + HINT,
        )
    )
    if lock is not None and freeze is not None:
        differs = lock_differences(lock, freeze)
        extra, missing, changed = differs["added"], differs["missing"], differs["changed"]
        ok = not (extra or missing or changed)
        checks.append(
            _check(
                "drift.env_packages",
                ok,
                "the environment holds exactly its lock"
                if ok
                else "the environment differs from its lock: "
                + "; ".join(
                    part
                    for part in (
                        f"added {', '.join(extra)}" if extra else "",
                        f"missing {', '.join(missing)}" if missing else "",
                        f"changed {', '.join(changed)}" if changed else "",
                    )
                    if part
                ),
                differs,
                "the lock's packages, no others",
                hint="packages were installed into the shared environment by hand; run playbooks/site.yml "
                "to put it back to its lock (the pytorch_env role does), or declare them in gpu_stack.packages",
            )
        )
    checks.extend(service_checks(facts.get("gpu_services"), services))
    checks.extend(package_checks(facts, dpkg))
    if converged is not None:
        checks.extend(since_last_run(converged))
    return checks


# --- reading the host (gpuenv verify --drift runs this on it) ------------------------------------
if TYPE_CHECKING:  # a runtime alias would need Python 3.9's subscripted builtins
    Runner = Callable[[list[str]], tuple[int, str, str]]


def run_command(argv: list[str]) -> tuple[int, str, str]:
    """A command's exit status and output; one that cannot start or runs past two minutes is 127."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603 - argv, no shell
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def _json_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def read_records(facts_dir: str, record: str) -> dict[str, Any]:
    """The roles' records, as Ansible reads them (ansible_local: each JSON `<role>.fact`), with the
    host's record of its stack as `gpuenv`. A record that is not JSON is left out: the checks that
    read it then say it is not recorded."""
    facts: dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(facts_dir, "*.fact"))):
        data = _json_file(path)
        if isinstance(data, dict):
            facts[os.path.basename(path)[: -len(".fact")]] = data
    stack = _json_file(record)
    if isinstance(stack, dict) and isinstance(stack.get("resolved"), dict):
        facts["gpuenv"] = stack
    return facts


def observe(facts: Mapping[str, Any], run: Runner = run_command) -> tuple[dict[str, Any], list[Check]]:
    """What compare reads from the live host besides the records: compare's keyword arguments, and a
    failing check for each input that could not be read (a broken pip, a dpkg-query that fails), in
    place of the check that would judge it."""
    env = facts.get("pytorch_env") or {}
    found: dict[str, Any] = {"lock": None, "freeze": None, "services": None, "dpkg": None}
    unread: list[Check] = []
    cuda = _link("/usr/local/cuda")
    # NVIDIA's toolkit packages point /usr/local/cuda at the cuda alternative, which points at the tree.
    found["cuda_link"] = _link(cuda) if cuda == "/etc/alternatives/cuda" else cuda
    found["env_link"] = _link(str(env.get("path") or "/opt/gpuenv/envs/default"))
    if env.get("lock") and env.get("path"):
        try:
            with open(str(env["lock"]), encoding="utf-8") as f:
                lock = f.read()
        except OSError as exc:
            unread.append(_unread("drift.env_packages", f"the environment's lock {env['lock']}", str(exc)))
        else:
            python = f"{env['path']}/bin/python"
            rc, out, err = run([python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"])
            if rc == 0:
                found["lock"], found["freeze"] = lock, out
            else:
                unread.append(
                    _unread("drift.env_packages", "the environment's packages (pip freeze)", err or f"rc {rc}")
                )
    packages = sorted(recorded_packages(facts))
    if packages:
        rc, out, err = run(["dpkg-query", "-W", "-f", hostparse.DPKG_QUERY_FORMAT, *packages])
        if rc in (0, 1):  # 1: a package dpkg does not know, which parse leaves out (not installed)
            found["dpkg"] = hostparse.parse_dpkg_query(out)
        else:
            unread.append(_unread("drift.packages", "dpkg's state of NVIDIA's packages", err or f"rc {rc}"))
    daemons = wanted_services(facts.get("gpu_services"))
    if daemons:
        units = [f"{unit}.service" for unit in daemons.values()]
        rc, out, err = run(["systemctl", "show", f"--property={hostparse.SYSTEMCTL_SHOW_PROPERTIES}", "--", *units])
        if rc == 0:
            found["services"] = hostparse.parse_systemctl_show(out)
        else:
            what = "systemd's state of the daemons gpu_services set up"
            unread += [_unread(f"drift.{key}", what, err or f"rc {rc}") for key in daemons]
    return found, unread


def _unread(check_id: str, what: str, error: str) -> Check:
    return Check(
        check_id,
        "fail",
        f"cannot read {what} on the host",
        observed=error.strip()[-1000:],
        expected="readable",
        hint="drift judges what it can read; fix what the error names, or run playbooks/site.yml to rebuild it",
    )


def host_checks(
    resolved: dict[str, Any],
    converged: Mapping[str, Any] | None = None,
    *,
    run: Runner | None = None,
) -> list[Check]:
    """The drift checks of the host this runs on (its records in FACTS_DIR and RECORD), against the
    declared (resolved) stack; converged: gpuenv_converged's comparison of the places site.yml
    writes (drift.yml passes it)."""
    facts = read_records(FACTS_DIR, RECORD)
    found, unread = observe(facts, run or run_command)
    checks = compare(resolved, facts, converged=converged, **found)
    replaced = {c.id for c in unread}
    return [c for c in checks if c.id not in replaced] + unread


def stack_summary(resolved: dict[str, Any]) -> dict[str, str]:
    """driver, CUDA, cuDNN and torch of a resolved stack, as the rollout summary prints them."""
    if not resolved:
        return {}
    torch = f"{resolved.get('torch')}+{resolved.get('torch_variant')}" if resolved.get("torch") else ""
    return {
        "driver": str(resolved.get("driver") or ""),
        "cuda": str(resolved.get("cuda") or ""),
        "cudnn": str(resolved.get("cudnn") or ""),
        "torch": torch,
        "packages": " ".join(resolved.get("packages") or []),
    }


def upgrade_changes(
    records_before: Mapping[str, Any] | None,
    records_after: Mapping[str, Any] | None,
    links_before: Mapping[str, str | None] | None,
    links_after: Mapping[str, str | None] | None,
) -> list[str]:
    """What an upgrade changed on a host, from its records (the local facts every role writes,
    ansible_local) and its switch points' link targets, read before and after: empty when nothing
    did. The records, not the links, are what tell a driver-only, services-only or cuDNN-only change
    (same links) from nothing at all."""
    before, after = dict(records_before or {}), dict(records_after or {})
    changes = [f"the {name} record" for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    lb, la = dict(links_before or {}), dict(links_after or {})
    changes += [
        f"{path} -> {la.get(path) or 'nothing'}" for path in sorted(set(lb) | set(la)) if lb.get(path) != la.get(path)
    ]
    return changes
