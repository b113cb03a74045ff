"""gpuenv doctor on two hosts set up by hand the way people do, built as fake host trees (tests/doctor_hosts.py):
the Debian 13 set up by hand (each problem named with its path and fix, and gone once fixed), the
one gpuenv provisioned (a clean bill), that doctor never writes, and the CLI around it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuenv import cli, versions
from gpuenv.checkspec import check_mapping
from gpuenv.compat import load
from gpuenv.doctor import driver as doctor_driver
from gpuenv.doctor import report
from gpuenv.doctor.driver import PROC_VERSION
from gpuenv.doctor.findings import Finding
from gpuenv.doctor.host import Host, root_runner
from gpuenv.doctor.run import Diagnosis, Options, examine
from tests import doctor_hosts
from tests.doctor_hosts import LEGACY, TRAIN, FakeHost, done, messy

DATA = load()
TREE = "/usr/local/cuda-11.8"


def diagnose(fh: FakeHost, **options: Any) -> Diagnosis:
    return examine(fh.host(), DATA, Options(**options))


def only(d: Diagnosis, rule: str) -> Finding:
    found = [f for f in d.findings if f.rule == rule]
    assert len(found) == 1, [(f.rule, f.message) for f in d.findings]
    return found[0]


def test_messy_host_names_each_problem_of_the_issue(tmp_path: Path) -> None:
    d = diagnose(messy(tmp_path / "root"))
    assert sorted(f.rule for f in d.findings) == [
        "cudnn-loader-cache",
        "cudnn-shadow",
        "driver-torch-cuda",
        "toolkit-conflict",
    ]
    assert d.exit_code == 1
    assert not d.provisioned
    # What it took stock of: both toolkits and all three cuDNN copies.
    assert {(t.path, t.version, t.kind) for t in d.toolkits} == {
        (TREE, "11.8.89", "tree"),
        ("/usr/bin/nvcc", "12.4.131", "package"),
    }
    assert {(c.lib, c.kind) for c in d.cudnn} == {
        (f"{TREE}/lib64", "tree"),
        (f"{TRAIN}/lib/python3.11/{doctor_hosts.WHEEL_LIB}", "wheel"),
        (f"{LEGACY}/lib/python3.11/{doctor_hosts.WHEEL_LIB}", "wheel"),
    }


def test_debian_toolkit_beside_a_redist_tree(tmp_path: Path) -> None:
    found = only(diagnose(messy(tmp_path / "root")), "toolkit-conflict")
    assert found.where == ["/usr/bin/nvcc", TREE]
    assert "12.4.131" in found.message
    assert "11.8.89" in found.message
    assert "sudo apt remove nvidia-cuda-toolkit" in found.fix
    assert f"CUDA_HOME={TREE}" in found.fix


def test_cudnn_copied_without_ldconfig_then_ldconfig_run(tmp_path: Path) -> None:
    fh = messy(tmp_path / "root")
    found = only(diagnose(fh), "cudnn-loader-cache")
    assert found.where == [f"{TREE}/lib64", "/etc/ld.so.conf.d/cuda.conf"]
    assert found.fix.startswith("sudo ldconfig")
    assert "libcudnn_ops_infer.so.8" in found.why
    # The file's own line, which the person looks for, and where it leads (/usr/local/cuda is a link).
    assert f"/etc/ld.so.conf.d/cuda.conf names /usr/local/cuda/lib64 (that is, {TREE}/lib64), but" in found.why
    # After `sudo ldconfig` the cache lists every soname the copy holds, where the loader looks.
    sonames = sorted(p.name for p in fh.path(f"{TREE}/lib64").glob("libcudnn*.so.8"))
    cache = doctor_hosts.data("ldconfig-p-messy.txt") + "".join(
        f"\t{n} (libc6,x86-64) => /usr/local/cuda/lib64/{n}\n" for n in sonames
    )
    fh.forget("/usr/sbin/ldconfig")
    fh.tool("/usr/sbin/ldconfig", ("-p", done(cache)))
    assert "cudnn-loader-cache" not in {f.rule for f in diagnose(fh).findings}


def test_torch_that_needs_a_newer_driver(tmp_path: Path) -> None:
    found = only(diagnose(messy(tmp_path / "root")), "driver-torch-cuda")
    minimum = DATA.toolkit_minimum_driver("13.0")
    assert minimum is not None
    assert found.env == TRAIN
    assert found.where == [TRAIN, PROC_VERSION]
    assert f"install driver {minimum} or newer" in found.fix
    # The other way out: a torch the installed driver runs, put into that environment.
    pip = found.fix.split(": ", 1)[1]
    assert pip.startswith(f"{TRAIN}/bin/python -m pip install torch==")
    variant = pip.rsplit("/", 1)[1]
    needs = DATA.toolkit_minimum_driver(f"{variant[2:-1]}.{variant[-1]}")
    assert needs is not None
    assert versions.parse(needs) <= versions.parse("550.163.01")


def test_system_cudnn_on_ld_library_path_then_taken_off(tmp_path: Path) -> None:
    fh = messy(tmp_path / "root")
    found = only(diagnose(fh), "cudnn-shadow")
    assert found.env == LEGACY
    assert found.where == [f"{LEGACY}/bin/activate", f"{TREE}/lib64", LEGACY]
    assert found.severity == "error"  # verify saw the tree's libcudnn mapped
    assert f"take /usr/local/cuda/lib64 out of LD_LIBRARY_PATH in {LEGACY}/bin/activate" in found.fix
    # verify ran in that environment with the LD_LIBRARY_PATH its activation gives.
    assert fh.verify_calls()[f"{LEGACY}/bin/python"]["LD_LIBRARY_PATH"].split(":")[0] == "/usr/local/cuda/lib64"
    assert "LD_LIBRARY_PATH" not in (fh.verify_calls()[f"{TRAIN}/bin/python"] or {})
    # Taken off, verify sees torch map its own cuDNN: nothing shadows it.
    fh.write(f"{LEGACY}/bin/activate", doctor_hosts.ACTIVATE.format(prefix=LEGACY))
    own = f"{LEGACY}/lib/python3.11/{doctor_hosts.WHEEL_LIB}/libcudnn.so.8"
    fh.forget(f"{LEGACY}/bin/python")
    doctor_hosts.verify_answer(
        fh, f"{LEGACY}/bin/python", doctor_hosts.report(cudnn__loaded_library=("pass", [own], None))
    )
    assert "cudnn-shadow" not in {f.rule for f in diagnose(fh).findings}


def test_a_shadow_says_whether_torch_loads_the_other_cudnn_in_part_or_whole(tmp_path: Path) -> None:
    # As seen on a sandbox host (molecule/doctor): torch 2.0.1 opened its own libcudnn.so.8 and cuDNN
    # then took its parts from the tree on LD_LIBRARY_PATH. The finding says so, not "instead of".
    fh = messy(tmp_path / "root")
    found = only(diagnose(fh), "cudnn-shadow")
    assert "loads in part (its sub-libraries) beside its own 8.5.0.96" in found.message
    assert f"got them from {TREE}/lib64: verify saw torch map {LEGACY}/lib/python3.11/" in found.why
    assert f"beside {TREE}/lib64/libcudnn_ops_infer.so.8.6.0, two cuDNN releases in one process" in found.why
    # A torch that opens libcudnn.so.8 by name gets all of it from the tree: "instead of" its own.
    fh.forget(f"{LEGACY}/bin/python")
    doctor_hosts.verify_answer(
        fh,
        f"{LEGACY}/bin/python",
        doctor_hosts.report(cudnn__loaded_library=("warn", doctor_hosts.MAPPED_WHOLE_BY_LEGACY, LEGACY)),
    )
    found = only(diagnose(fh), "cudnn-shadow")
    assert "loads instead of its own 8.5.0.96" in found.message
    assert f"so libcudnn.so.8 comes from {TREE}/lib64; verify saw torch map {TREE}/lib64/libcudnn.so.8.6.0" in found.why


def test_clean_gpuenv_host_gets_a_clean_bill(tmp_path: Path) -> None:
    d = diagnose(doctor_hosts.clean(tmp_path / "root"))
    assert d.findings == []
    assert d.exit_code == 0
    assert d.provisioned
    assert [e.path for e in d.envs] == ["/opt/gpuenv/envs/default"]
    assert d.envs[0].verify is not None
    assert d.envs[0].verify["exit_code"] == 0
    text = report.text(d, DATA)
    assert "No findings" in text
    assert text.endswith("verdict: clean; exit 0\n")
    # The stack it shows is one check-spec accepts.
    stacks = d.advice.stacks()
    assert stacks
    for stack in stacks:
        assert check_mapping(stack)["exit_code"] == 0


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    seen = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            st = path.lstat()
            body = (
                os.readlink(path)
                if path.is_symlink()
                else ""
                if path.is_dir()
                else hashlib.sha256(path.read_bytes()).hexdigest()
            )
            seen[str(path.relative_to(root))] = (st.st_mode, st.st_mtime_ns, body)
    return seen


READ_ONLY = {
    "ldconfig": ["-p"],
    "dpkg-query": ["-W"],
    "nvidia-smi": ["--query-gpu=driver_version", "--query-gpu=name,compute_cap"],
    "modinfo": ["-F"],
    "nvcc": ["--version"],
    "ptxas": ["--version"],
}


@pytest.mark.parametrize("build", [messy, doctor_hosts.clean])
def test_doctor_never_writes(tmp_path: Path, build: Any) -> None:
    fh = build(tmp_path / "root")
    before = _snapshot(fh.root)
    d = diagnose(fh)
    report.text(d, DATA)
    report.as_json(d, DATA)
    assert _snapshot(fh.root) == before
    # Every command it ran is a reader: the probes' query forms, and verify with its report on stdout.
    assert fh.calls
    for argv, _env in fh.calls:
        name = os.path.basename(argv[0])
        if name == "python":
            assert argv[2:] == ["--json", "-", "--no-distributed"], argv
        else:
            assert argv[1] in READ_ONLY[name], argv


def test_json_for_programs(tmp_path: Path) -> None:
    d = diagnose(messy(tmp_path / "root"))
    out = json.loads(report.as_json(d, DATA))
    assert out["schema"] == "gpuenv-doctor/1"
    assert (out["verdict"], out["exit_code"]) == ("findings", 1)
    assert {f["rule"] for f in out["findings"]} == {f.rule for f in d.findings}
    shadow = next(f for f in out["findings"] if f["rule"] == "cudnn-shadow")
    assert shadow["where"][0] == f"{LEGACY}/bin/activate"
    assert shadow["env"] == LEGACY
    assert "LD_LIBRARY_PATH" in shadow["fix"]
    assert set(out["sources"]) == {k for f in d.findings for k in f.sources}
    assert [e["path"] for e in out["environments"]] == [TRAIN, LEGACY]
    assert out["driver"]["effective"] == ["550.163.01", PROC_VERSION]
    assert out["suggestion"]["result"]["verdict"] == "found"


def test_cli_on_a_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fh = messy(tmp_path / "root")
    # The CLI's runner for another root, answered by the fake host instead of this machine's tools.
    monkeypatch.setattr(cli, "root_runner", lambda root: fh.runner)
    assert cli.main(["doctor", "--root", str(fh.root), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert {f["rule"] for f in out["findings"]} >= {"cudnn-loader-cache", "toolkit-conflict"}
    assert any(n.startswith(f"--root {fh.root}:") for n in out["notes"])
    assert fh.verify_calls() == {}  # verify would run this machine's libraries: not under another root


def test_a_trees_nvidia_smi_is_named_not_run(tmp_path: Path) -> None:
    # Under --root the tree's nvidia-smi is found but not run (it would ask this machine's driver):
    # doctor says so instead of reporting an exit status that no command returned.
    smi = tmp_path / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    found = doctor_driver.probe(Host(root=tmp_path, runner=root_runner(tmp_path), environ={"PATH": "/usr/bin"}), {})
    assert found.smi_version is None
    assert found.smi_error == "present, not run (another host's tree: its commands are not run)"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--depth", "-1"], "--depth -1: give how many directory levels"),
        (["--verify-timeout", "0"], "--verify-timeout 0: give the seconds"),
        (["--gpu", "no-such-gpu"], "no-such-gpu"),
        (["--root", "/nonexistent/doctor-root"], "is not a directory"),
    ],
)
def test_cli_refuses_bad_input(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", *argv]) == 2
    assert said in capsys.readouterr().err


def test_a_machine_without_a_gpu_and_a_cpu_torch(tmp_path: Path) -> None:
    # Like the machine these tests run on: no driver, no GPU on the bus, torch's CPU build in a venv.
    fh = FakeHost(tmp_path / "root")
    doctor_hosts.debian(fh, "12", "ldconfig-p-messy.txt", None)
    fh.forget("/usr/sbin/ldconfig")
    fh.tool("/usr/sbin/ldconfig", ("-p", done("0 libs found in cache `/etc/ld.so.cache'\n")))
    doctor_hosts.venv(fh, "/home/alice/.venv", "2.13.0+cpu", None)
    verify = json.loads(doctor_hosts.data("verify-torch-2.13.0+cpu.json"))
    doctor_hosts.verify_answer(fh, "/home/alice/.venv/bin/python", verify)
    d = diagnose(fh)
    assert d.findings == []
    assert (d.gpus, d.driver.effective) == ([], None)
    assert any(n.startswith("no NVIDIA GPU found") for n in d.notes)
    assert d.advice.stacks() == []
    assert "would replace" not in report.text(d, DATA)
    assert "verify exit 0 (3 pass, 0 fail, 0 warn, 20 skip)" in report.text(d, DATA)


def test_a_package_cudnn_beside_the_tree_s_copy_names_the_one_programs_load_and_why(tmp_path: Path) -> None:
    """NVIDIA's libcudnn9-cuda-12 in the system directory and the tarball's copy in the CUDA tree
    that gpuenv-cuda.conf names: the cache lists the tree's first (its file comes before
    x86_64-linux-gnu.conf), so that is the copy a program loads."""
    fh = doctor_hosts.clean(tmp_path / "root")
    doctor_hosts.cudnn_into(
        fh, doctor_hosts.MULTIARCH, "/usr/include/x86_64-linux-gnu", "cudnn_version-9.1.0.70.h", "9.3.0"
    )
    cache = doctor_hosts.data("ldconfig-p-clean.txt") + "".join(
        f"\tlibcudnn{p}.so.9 (libc6,x86-64) => {doctor_hosts.MULTIARCH}/libcudnn{p}.so.9\n"
        for p in ["", *(f"_{n}" for n in doctor_hosts.CUDNN9)]
    )
    fh.forget("/usr/sbin/ldconfig")
    fh.tool("/usr/sbin/ldconfig", ("-p", done(cache)))
    found = only(diagnose(fh), "cudnn-copies")
    tree_lib = f"{doctor_hosts.GPUENV_TREE}/lib"
    assert found.severity == "error"  # 9.1.0 against 9.3.0
    assert found.message.startswith(f"two cuDNN 9 copies the loader knows: programs load {tree_lib}/libcudnn.so.9")
    assert f"{doctor_hosts.MULTIARCH} (cuDNN 9.3.0, the system directory" in found.message
    assert "/etc/ld.so.conf.d/gpuenv-cuda.conf" in found.why
    assert f"(that is, {doctor_hosts.MULTIARCH}) is named by /etc/ld.so.conf.d/x86_64-linux-gnu.conf" in found.why
    assert "sudo apt remove 'libcudnn9*'" in found.fix
    assert found.where == [tree_lib, doctor_hosts.MULTIARCH]
    # One copy: no finding.
    assert "cudnn-copies" not in {f.rule for f in diagnose(doctor_hosts.clean(tmp_path / "one")).findings}
