"""What differs on a host from the stack the inventory declares (playbooks/drift.yml).

The inputs are what the host says of itself, read without changing anything: the local facts the
roles recorded (/etc/ansible/facts.d), where /usr/local/cuda and the environment's stable path
really point, and `pip freeze` of the environment against its lock. The output is checks in
gpuenv verify's report model (gpuenv.verify.model; ids `drift.*`), merged into the host's verify
report (model.merge), so the fleet report shows them beside verify's.
Tested in tests/test_drift.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify.model import Check

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


def service_checks(record: Any, units: Mapping[str, Any] | None) -> list[Check]:
    """drift.<service> for each daemon gpu_services set up (its record, gpu_services.fact, says
    wanted): its unit must exist and be enabled, as systemd reports it (service_facts: {"x.service":
    {"status": "enabled", ...}}). A removed package leaves no unit: missing."""
    checks: list[Check] = []
    if not isinstance(record, Mapping):
        return checks
    for key, default_unit in SERVICE_UNITS.items():
        entry = record.get(key)
        if not isinstance(entry, Mapping) or not entry.get("wanted"):
            continue
        unit = str(entry.get("unit") or default_unit)
        live = (units or {}).get(f"{unit}.service")
        status = str(live.get("status")) if isinstance(live, Mapping) else "missing"
        ok = status == "enabled"
        if status == "missing":
            state = "missing (no unit: its package was removed?)"
        elif status == "failed":
            # service_facts puts a failed run in place of the unit file's state, so whether it is
            # still enabled is unknown here; the failure is the finding
            state = f"failed (systemd's last start of it failed: journalctl -u {unit})"
        else:
            state = status
        checks.append(
            _check(
                f"drift.{key}",
                ok,
                f"{unit} is enabled"
                if ok
                else f"{unit} is {state}, though gpu_services set it up ({entry.get('why', '')})",
                status,
                "enabled",
                hint=f"systemctl enable --now {unit}, or run playbooks/site.yml (stage gpu_services) to install and "
                "enable it again; set gpu_services_" + key + ": off where the host should not run it",
            )
        )
    return checks


def package_checks(facts: Mapping[str, Any], dpkg: Mapping[str, Any] | None) -> list[Check]:
    """drift.packages: the packages the roles installed from NVIDIA's repository and hold (their
    records name each with its version: cudnn's libcudnn9-cuda-12, cuda_toolkit's cuda-toolkit-12-4)
    against dpkg's state (gpuenv_host_state's dpkg): still installed, at that version, held. An
    `apt-mark unhold` and an `apt install libcudnn9-cuda-12=<newer>` by hand are what it sees."""
    recorded: dict[str, str] = {}
    for role in ("cudnn", "cuda_toolkit"):
        record = facts.get(role) or {}
        packages = record.get("packages") if isinstance(record, Mapping) else None
        if isinstance(packages, Mapping):
            recorded.update({str(k): str(v) for k, v in packages.items()})
    if not recorded:
        return []
    state = dpkg or {}
    problems = []
    for name, version in sorted(recorded.items()):
        have = state.get(name) or {}
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
) -> list[dict[str, Any]]:
    """The drift checks of one host (as the report's dicts): its records and what is live, against
    the declared stack. services: the host's systemd units as service_facts reports them, for the
    daemons gpu_services recorded (service_checks); dpkg: dpkg's state of the packages the records
    name (package_checks)."""
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
    return [c.as_dict() for c in checks]


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
