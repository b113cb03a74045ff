"""gpuenv.drift on what a real sandbox host recorded (tests/data/drift-host: its local facts,
its environment's lock and `pip freeze --all`), as it was and after the hand changes drift.yml
must find; and the rollout summary's table."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuenv import drift
from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify import model

DATA = Path(__file__).parent / "data" / "drift-host"


def _facts() -> dict[str, Any]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.fact"))}


def _compare(facts: dict[str, Any] | None = None, **overrides: Any) -> dict[str, dict[str, Any]]:
    facts = facts if facts is not None else _facts()
    args: dict[str, Any] = {
        "cuda_link": (DATA / "cuda-link.txt").read_text().strip(),
        "env_link": facts["pytorch_env"]["active"],
        "lock": (DATA / "lock.txt").read_text(),
        "freeze": (DATA / "pip-freeze.txt").read_text(),
    }
    args.update(overrides)
    resolved = facts["gpuenv"]["resolved"]
    return {c.id: c.as_dict() for c in drift.compare(resolved, facts, **args)}


def test_a_host_as_provisioned_has_no_drift() -> None:
    checks = _compare()
    assert {c["status"] for c in checks.values()} == {"pass"}, [c for c in checks.values() if c["status"] != "pass"]
    assert set(checks) == {
        "drift.record",
        "drift.driver",
        "drift.cuda_default",
        "drift.cuda_installed",
        "drift.cudnn",
        "drift.env_torch",
        "drift.env_active",
        "drift.env_packages",
    }


def test_a_toolkit_default_repointed_by_hand() -> None:
    checks = _compare(cuda_link="/usr/local/cuda-11.8")
    assert checks["drift.cuda_default"]["status"] == "fail"
    assert checks["drift.cuda_default"]["observed"] == "/usr/local/cuda-11.8"
    assert "by hand" in checks["drift.cuda_default"]["hint"]


def test_packages_added_changed_or_removed_by_hand() -> None:
    freeze = (DATA / "pip-freeze.txt").read_text()
    torch_line = next(line for line in freeze.splitlines() if line.startswith("torch=="))
    first_locked = next(
        line for line in freeze.splitlines() if not line.startswith(("pip==", "setuptools==", "torch=="))
    )
    edited = freeze.replace(torch_line, "torch==2.4.0").replace(first_locked + "\n", "") + "six==1.16.0\n"
    found = _compare(freeze=edited)["drift.env_packages"]
    assert found["status"] == "fail"
    assert found["observed"]["added"] == ["six==1.16.0"]
    assert found["observed"]["changed"] == [f"torch: {torch_line.split('==')[1]} -> 2.4.0"]
    assert found["observed"]["missing"] == [
        hostparse.normalise(first_locked.split("==")[0]) + "==" + first_locked.split("==")[1]
    ]
    assert "gpu_stack.packages" in found["hint"]


def test_an_environment_path_repointed_by_hand() -> None:
    checks = _compare(env_link="/opt/gpuenv/envs/.store/default-000000000000")
    assert checks["drift.env_active"]["status"] == "fail"


def test_a_host_provisioned_for_another_stack() -> None:
    facts = _facts()
    declared = copy.deepcopy(facts["gpuenv"]["resolved"])
    declared["cuda"] = "12.4.1"
    found = drift.compare(declared, facts, cuda_link="/usr/local/cuda-12.1", env_link=None, lock=None, freeze=None)
    checks = {c.id: c.as_dict() for c in found}
    assert checks["drift.record"]["status"] == "fail"
    assert checks["drift.record"]["observed"]["cuda"] == facts["gpuenv"]["resolved"]["cuda"]
    assert checks["drift.cuda_default"]["status"] == "fail"
    assert checks["drift.cuda_installed"]["status"] == "fail"
    assert "drift.env_packages" not in checks  # no lock or freeze: not judged


def test_a_host_gpuenv_never_provisioned() -> None:
    resolved = _facts()["gpuenv"]["resolved"]
    found = drift.compare(resolved, {}, cuda_link=None, env_link=None, lock=None, freeze=None)
    checks = {c.id: c.as_dict() for c in found}
    assert checks["drift.record"]["observed"] == "no gpuenv record on the host"
    assert {c["status"] for c in checks.values()} == {"fail"}


def test_the_real_lock_and_freeze_parse() -> None:
    lock = hostparse.parse_lock((DATA / "lock.txt").read_text())
    frozen = hostparse.parse_freeze((DATA / "pip-freeze.txt").read_text())
    assert lock["torch"] == frozen["torch"]
    assert set(lock) <= set(frozen)
    assert "pip" in frozen
    assert "pip" not in lock


def test_the_summary_of_a_stack() -> None:
    resolved = _facts()["gpuenv"]["resolved"]
    summary = drift.stack_summary(resolved)
    assert summary["cuda"] == resolved["cuda"]
    assert summary["torch"] == f"{resolved['torch']}+{resolved['torch_variant']}"
    assert drift.stack_summary({}) == {}


@pytest.fixture
def rollout() -> Any:
    path = Path(__file__).resolve().parents[1] / "plugins/callback/gpuenv_rollout.py"
    pytest.importorskip("ansible")
    spec = importlib.util.spec_from_file_location("gpuenv_rollout", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuenv_rollout"] = module
    spec.loader.exec_module(module)
    return module


def test_the_rollout_summary_names_every_host(rollout: Any) -> None:
    stack = {"driver": "535", "cuda": "12.4.1", "cudnn": "9.1.0.70", "torch": "2.5.1+cu124", "packages": ""}
    old = {**stack, "cuda": "12.1.1"}
    hosts = {
        "sb1": {"state": "upgraded", "batch": 1, "was": old, "now": stack, "verify": "pass"},
        "sb2": {
            "state": "rolled back",
            "batch": 2,
            "was": old,
            "now": old,
            "verify": "pass",
            "note": "upgrade failed at x",
        },
        "sb3": {"state": "waiting", "was": old},
    }
    text = rollout.render(hosts, "batch 2 failed (sb2); 1 host(s) were not touched (sb3)")
    lines = text.splitlines()
    assert lines[0].startswith("Rollout stopped: batch 2 failed")
    assert "| sb1 | 1 | upgraded | driver 535, CUDA 12.4.1" in text
    assert "| sb2 | 2 | rolled back | driver 535, CUDA 12.1.1" in text
    assert "verify pass; upgrade failed at x" in text
    assert "| sb3 | - | untouched: the rollout stopped before its batch | driver 535, CUDA 12.1.1" in text
    assert rollout.render(hosts | {"sb3": {"state": "upgraded", "batch": 3}}, None).startswith("Rollout complete")


# What gpu_services records (roles/gpu_services/tasks/record.yml) on an HGX host that got both
# daemons.
SERVICES_RECORD = {
    "persistenced": {"wanted": True, "why": "auto: data-centre GPU A100", "unit": "nvidia-persistenced"},
    "fabricmanager": {"wanted": True, "why": "auto: 6 NVSwitches (10de:1af1, gen 2) on the PCI bus"},
    "container_toolkit": {"wanted": False, "why": "auto: no container runtime on the host"},
}


def _units(name: str) -> dict[str, dict[str, str]]:
    """`systemctl show --property=Id,LoadState,ActiveState,UnitFileState -- nvidia-persistenced.service
    nvidia-fabricmanager.service` on a sandbox host (tests/data/README.md)."""
    return hostparse.parse_systemctl_show((DATA / f"systemctl-show-{name}.txt").read_text())


def test_the_daemons_gpu_services_set_up_must_stay_enabled() -> None:
    facts = {**_facts(), "gpu_services": SERVICES_RECORD}
    # As gpu_services left them: persistenced enabled (its start failed: no GPU in the sandbox); no
    # Fabric Manager installed on this host, so for the HGX record it is missing.
    units = _units("enabled")
    assert units["nvidia-persistenced.service"]["ActiveState"] == "failed"
    assert units["nvidia-fabricmanager.service"]["LoadState"] == "not-found"
    ok = _compare(facts, services=units)
    assert ok["drift.persistenced"]["status"] == "pass"
    assert "its last start failed: journalctl -u nvidia-persistenced" in ok["drift.persistenced"]["summary"]
    assert ok["drift.fabricmanager"]["status"] == "fail"
    assert "nvidia-fabricmanager is missing" in ok["drift.fabricmanager"]["summary"]
    # disabled by hand: systemd says so whatever the last start did
    bad = _compare(facts, services=_units("disabled"))
    assert bad["drift.persistenced"]["status"] == "fail"
    assert bad["drift.persistenced"]["observed"] == "disabled"
    assert "systemctl enable --now nvidia-persistenced" in bad["drift.persistenced"]["hint"]
    # the toolkit is no daemon, and a service gpu_services left off is not checked
    assert "drift.container_toolkit" not in bad


def test_a_host_without_services_gets_no_service_checks() -> None:
    off = {"persistenced": {"wanted": False}, "fabricmanager": {"wanted": False}}
    assert not any(k.startswith(("drift.persistenced", "drift.fabricmanager")) for k in _compare(services={}))
    checks = _compare({**_facts(), "gpu_services": off}, services={})
    assert "drift.persistenced" not in checks


def test_the_rollout_summary_says_what_an_upgrade_changed(rollout: Any) -> None:
    stack = {"driver": "550", "cuda": "12.4.1", "cudnn": "9.1.0.70", "torch": "2.5.1+cu124", "packages": ""}
    changed = ["the nvidia_driver record"]
    hosts = {"sb1": {"state": "upgraded", "batch": 1, "now": stack, "verify": "pass", "changed": changed}}
    row = "| sb1 | 1 | upgraded | driver 550, CUDA 12.4.1, cuDNN 9.1.0.70, torch 2.5.1+cu124 |"
    assert f"{row} verify pass; changed: the nvidia_driver record |" in rollout.render(hosts, None)


def test_what_only_the_stamp_sees_is_named_by_its_places() -> None:
    """drift.since_last_run reads gpuenv_converged's check (in check mode) of the places site.yml's
    stages write: a hold, a pin file, a profile script changed since the last complete run."""
    clean = {"converged": False, "differs": ["inputs"], "why": "the declared settings or gpuenv's code changed"}
    assert _compare(converged=clean)["drift.since_last_run"]["status"] == "pass"
    touched = {"converged": False, "differs": ["inputs", "watch:/etc/profile.d", "watch:/var/lib/dpkg/status"]}
    check = _compare(converged={**touched, "why": "changed on the host since"})["drift.since_last_run"]
    assert check["status"] == "fail"
    assert check["summary"] == "changed since the last complete run of site.yml: /etc/profile.d, /var/lib/dpkg/status"
    assert "run playbooks/site.yml" in check["hint"]
    none = {"converged": False, "differs": [], "why": "no stamp of a complete run (the first run): every stage runs"}
    assert _compare(converged=none)["drift.since_last_run"]["status"] == "skip"
    assert "drift.since_last_run" not in _compare()  # a caller that reads no stamp gets no such check


def _repo_host() -> dict[str, Any]:
    """The drift host's records as the roles write them where cuDNN and the toolkit came from
    NVIDIA's repository: each package with the version it was installed and held at."""
    facts = copy.deepcopy(_facts())
    facts["cudnn"] = {
        **facts["cudnn"],
        "source": "nvidia_repo",
        "packages": {"libcudnn9-cuda-12": "9.1.0.70-1", "libcudnn9-dev-cuda-12": "9.1.0.70-1"},
    }
    facts["cuda_toolkit"] = {**facts["cuda_toolkit"], "packages": {"cuda-toolkit-12-4": "12.4.1-1"}}
    return facts


# gpuenv_host_state's dpkg state (parse_dpkg_query of `dpkg-query -W -f '${db:Status-Abbrev} ...'`).
HELD = hostparse.parse_dpkg_query(
    "hi  libcudnn9-cuda-12 9.1.0.70-1\nhi  libcudnn9-dev-cuda-12 9.1.0.70-1\nhi  cuda-toolkit-12-4 12.4.1-1\n"
)


def test_nvidia_s_packages_as_installed_and_held_pass() -> None:
    check = _compare(_repo_host(), dpkg=HELD)["drift.packages"]
    assert check["status"] == "pass", check
    assert "cuda-toolkit-12-4, libcudnn9-cuda-12, libcudnn9-dev-cuda-12" in check["summary"]


def test_a_held_cudnn_package_unheld_and_upgraded_by_hand_is_named() -> None:
    """apt-mark unhold libcudnn9-cuda-12; apt install libcudnn9-cuda-12=9.1.1.17-1."""
    upgraded = hostparse.parse_dpkg_query(
        "ii  libcudnn9-cuda-12 9.1.1.17-1\nhi  libcudnn9-dev-cuda-12 9.1.0.70-1\nhi  cuda-toolkit-12-4 12.4.1-1\n"
    )
    check = _compare(_repo_host(), dpkg=upgraded)["drift.packages"]
    assert check["status"] == "fail"
    assert check["observed"] == [
        "libcudnn9-cuda-12 is 9.1.1.17-1, not 9.1.0.70-1: changed behind gpuenv's back",
        "libcudnn9-cuda-12 is not held any more",
    ]
    assert "run playbooks/site.yml" in check["hint"]
    # Removed altogether: dpkg does not know it (gpuenv_host_state leaves it out).
    removed = {k: v for k, v in HELD.items() if k != "cuda-toolkit-12-4"}
    check = _compare(_repo_host(), dpkg=removed)["drift.packages"]
    assert check["observed"] == ["cuda-toolkit-12-4 is not installed (gpuenv installed 12.4.1-1)"]


def test_records_without_packages_add_no_package_check() -> None:
    assert "drift.packages" not in _compare(dpkg=HELD)


# --- reading the host: gpuenv verify --drift ---------------------------------------------------------
def _host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any]) -> Path:
    """A host's records under tmp_path: the roles' records in facts.d, the stack's in stack.json."""
    facts_dir = tmp_path / "facts.d"
    facts_dir.mkdir()
    for name, record in facts.items():
        if name != "gpuenv":
            (facts_dir / f"{name}.fact").write_text(json.dumps(record))
    (tmp_path / "stack.json").write_text(json.dumps(facts["gpuenv"]))
    monkeypatch.setattr(drift, "FACTS_DIR", str(facts_dir))
    monkeypatch.setattr(drift, "RECORD", str(tmp_path / "stack.json"))
    return facts_dir


def _runner(calls: list[list[str]], **outputs: tuple[int, str, str]) -> Any:
    """A stand-in for the commands drift runs, answering by the command's name (pip: the
    environment's python -m pip) with (rc, stdout, stderr)."""

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return outputs["pip" if argv[1:3] == ["-m", "pip"] else Path(argv[0]).name]

    return run


def test_the_host_s_own_records_are_what_drift_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = _facts()
    facts_dir = _host(tmp_path, monkeypatch, facts)
    (facts_dir / "broken.fact").write_text("[section]\nnot = json\n")  # a site's INI fact: not gpuenv's
    read = drift.read_records(drift.FACTS_DIR, drift.RECORD)
    assert read == facts  # the record of the stack from stack.json, the others from facts.d
    # A record edited by hand is what drift.record compares with the inventory's stack.
    edited = copy.deepcopy(facts["gpuenv"])
    edited["resolved"]["cuda"] = "12.1.0"
    (tmp_path / "stack.json").write_text(json.dumps(edited))
    calls: list[list[str]] = []
    run = _runner(calls, pip=(0, (DATA / "pip-freeze.txt").read_text(), ""))
    checks = {c.id: c for c in drift.host_checks(facts["gpuenv"]["resolved"], None, run=run)}
    assert checks["drift.record"].status == "fail"
    assert checks["drift.record"].observed["cuda"] == "12.1.0"
    # the lock the pytorch_env record names is not on this machine: drift says it cannot read it
    assert checks["drift.env_packages"].status == "fail"
    assert checks["drift.env_packages"].summary.startswith("cannot read the environment's lock")
    assert calls == []  # no lock, no pip freeze to compare with it


def test_drift_asks_pip_dpkg_and_systemd_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = {**_repo_host(), "gpu_services": SERVICES_RECORD}
    lock = tmp_path / "lock.txt"
    lock.write_text((DATA / "lock.txt").read_text())
    facts["pytorch_env"] = {**facts["pytorch_env"], "lock": str(lock)}
    _host(tmp_path, monkeypatch, facts)
    calls: list[list[str]] = []
    run = _runner(
        calls,
        pip=(0, (DATA / "pip-freeze.txt").read_text(), ""),
        **{
            # rc 1: dpkg knows no cuda-toolkit-12-4 (removed and purged)
            "dpkg-query": (1, "hi  libcudnn9-cuda-12 9.1.0.70-1\nii  libcudnn9-dev-cuda-12 9.1.0.70-1\n", ""),
            "systemctl": (0, (DATA / "systemctl-show-disabled.txt").read_text(), ""),
        },
    )
    checks = {c.id: c for c in drift.host_checks(facts["gpuenv"]["resolved"], None, run=run)}
    assert checks["drift.env_packages"].status == "pass"
    assert checks["drift.packages"].observed == [
        "cuda-toolkit-12-4 is not installed (gpuenv installed 12.4.1-1)",
        "libcudnn9-dev-cuda-12 is not held any more",
    ]
    assert checks["drift.persistenced"].observed == "disabled"
    env_python = f"{facts['pytorch_env']['path']}/bin/python"
    assert calls == [
        [env_python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
        [
            "dpkg-query",
            "-W",
            "-f",
            hostparse.DPKG_QUERY_FORMAT,
            "cuda-toolkit-12-4",
            "libcudnn9-cuda-12",
            "libcudnn9-dev-cuda-12",
        ],
        [
            "systemctl",
            "show",
            "--property=Id,LoadState,ActiveState,UnitFileState",
            "--",
            "nvidia-persistenced.service",
            "nvidia-fabricmanager.service",
        ],
    ]
    # What cannot be read fails the check that needed it, with the command's error, instead of
    # judging from nothing (a dpkg database that is locked, a pip that is broken).
    broken = _runner(
        [],
        pip=(1, "", "No module named pip"),
        **{"dpkg-query": (2, "", "dpkg: error: parsing file"), "systemctl": (1, "", "Failed to connect to bus")},
    )
    checks = {c.id: c for c in drift.host_checks(facts["gpuenv"]["resolved"], None, run=broken)}
    assert (checks["drift.env_packages"].status, checks["drift.env_packages"].observed) == (
        "fail",
        "No module named pip",
    )
    assert checks["drift.packages"].summary == "cannot read dpkg's state of NVIDIA's packages on the host"
    assert checks["drift.persistenced"].observed == "Failed to connect to bus"
    assert [c.id for c in drift.host_checks(facts["gpuenv"]["resolved"], None, run=broken)].count("drift.packages") == 1


def test_verify_drift_reports_both_in_one_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpuenv-verify --drift`: verify's checks and drift's in one report. Here verify cannot run
    (the environment's Python is gone): drift still reads the host, and the report says both."""
    from gpuenv.verify import cli  # noqa: PLC0415 - beside the drift tests it belongs with

    facts = _facts()
    _host(tmp_path, monkeypatch, facts)
    monkeypatch.setattr(drift, "run_command", _runner([], pip=(0, (DATA / "pip-freeze.txt").read_text(), "")))
    out = tmp_path / "report.json"
    argv = ["--stack", drift.RECORD, "--json", str(out), "--python-missing", "/opt/gone/bin/python"]
    places = {"converged": False, "differs": ["inputs", "watch:/etc/profile.d"], "why": "changed on the host since"}
    assert cli.main([*argv, "--drift", "--drift-places", json.dumps(places)]) == 2
    report = json.loads(out.read_text())
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["verify.run"]["status"] == "fail"
    assert checks["drift.record"]["status"] == "pass"  # --stack read the record: its resolved stack
    assert checks["drift.since_last_run"]["observed"] == ["/etc/profile.d"]
    assert report["stack_id"] == model.stack_id(facts["gpuenv"]["resolved"])
    # without --drift, verify alone
    assert cli.main(argv) == 2
    assert [c["id"] for c in json.loads(out.read_text())["checks"]] == ["verify.run"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--drift-places", "{}"], "--drift-places goes with --drift"),
        (["--drift", "--drift-places", "{not json"], "--drift-places: not JSON"),
        (["--drift", "--drift-places", "[]"], "give the gpuenv_converged module's result"),
    ],
)
def test_verify_refuses_drift_places_it_cannot_use(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuenv.verify import cli  # noqa: PLC0415 - beside the drift tests it belongs with

    assert cli.main(["--stack", "-", *args]) == 2
    assert said in capsys.readouterr().err


def test_a_record_without_its_resolved_stack_is_refused(tmp_path: Path) -> None:
    from gpuenv.verify import cli  # noqa: PLC0415 - beside the drift tests it belongs with

    record = tmp_path / "stack.json"
    record.write_text(json.dumps(_facts()["gpuenv"]))
    assert cli.read_stack(str(record)) == _facts()["gpuenv"]["resolved"]
    record.write_text(json.dumps({"declared": {"cuda": "12.4"}}))
    with pytest.raises(ValueError, match="without its resolved stack"):
        cli.read_stack(str(record))
