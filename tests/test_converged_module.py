"""The gpuenv_converged module (plugins/modules): its fingerprints of the places the stages write,
and the stamp a complete run leaves, which a re-run of site.yml compares with to skip the stages
(the 10-second no-op). The role, its digest and site.yml's plays are tested in
tests/test_converged.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin, run_tool

mod = load_plugin("plugins/modules/gpuenv_converged.py")
fp = load_plugin("plugins/module_utils/gpuenv_fingerprint.py")


def no_systemctl(args: list[str]) -> tuple[int, str, str]:
    raise AssertionError(f"no command expected: {args}")


def params(tmp: Path, **over: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "state": "check",
        "path": str(tmp / "state/converged.json"),
        "inputs": "digest-1",
        "watch": [str(tmp / "etc")],
        "walk": [str(tmp / "trees")],
        "read": [str(tmp / "version")],
        "units": [],
        "pending": [str(tmp / "run/reboot-required")],
        "verify_report": str(tmp / "verify.json"),
        "skip": True,
    }
    return {**p, **over}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    (tmp_path / "etc/profile.d").mkdir(parents=True)
    (tmp_path / "etc/cuda.sh").write_text("export PATH=/usr/local/cuda/bin:$PATH\n")
    lib = tmp_path / "trees/12.4.1/lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.9.1.0").write_bytes(b"\0" * 64)
    (lib / "libcudnn.so.9").symlink_to("libcudnn.so.9.1.0")
    (tmp_path / "version").write_text("535.216.01\n")
    (tmp_path / "verify.json").write_text('{"exit_code": 0, "checks": []}\n')
    return tmp_path


def check(tmp: Path, **over: Any) -> dict[str, Any]:
    return mod.run(params(tmp, **over), False, None, no_systemctl)


def stamp(tmp: Path, **over: Any) -> dict[str, Any]:
    return mod.run(params(tmp, state="stamp", **over), False, None, no_systemctl)


def test_a_host_without_a_stamp_runs_every_stage_and_a_stamped_one_is_converged(host: Path) -> None:
    first = check(host)
    assert (first["converged"], first["cleared"], first["changed"]) == (False, False, False)
    assert first["why"].startswith("no stamp of a complete run")
    written = stamp(host)
    assert (written["stamped"], written["changed"]) == (True, False)
    assert json.loads((host / "state/converged.json").read_text())["inputs"] == "digest-1"
    again = check(host)
    assert (again["converged"], again["differs"]) == (True, [])
    assert stamp(host)["stamped"] is False  # the same stamp is not rewritten


@pytest.mark.parametrize(
    ("change", "place"),
    [
        # Each a change a stage would act on: a library gone, a link moved, a file's mode or content
        # (size, time), a file added where the loader looks, the loaded driver's version.
        (lambda h: (h / "trees/12.4.1/lib/libcudnn.so.9.1.0").unlink(), "walk:{h}/trees"),
        (lambda h: _relink(h / "trees/12.4.1/lib/libcudnn.so.9", "libcudnn.so.8"), "walk:{h}/trees"),
        (lambda h: (h / "trees/12.4.1/lib/libcudnn.so.9.1.0").chmod(0o600), "walk:{h}/trees"),
        (lambda h: (h / "trees/12.4.1/lib/libcudnn.so.9.1.0").write_bytes(b"\0" * 65), "walk:{h}/trees"),
        (lambda h: os.utime(h / "trees/12.4.1/lib/libcudnn.so.9.1.0", ns=(1, 1)), "walk:{h}/trees"),
        (lambda h: (h / "trees/12.4.1/lib/extra.so").write_bytes(b""), "walk:{h}/trees"),
        (lambda h: (h / "trees/12.4.1/lib").rename(h / "trees/12.4.1/lib64"), "walk:{h}/trees"),
        (lambda h: (h / "etc/cuda.sh").write_text("export PATH=/usr/local/cuda-11.8/bin:$PATH\n"), "watch:{h}/etc"),
        (lambda h: (h / "etc/cuda.sh").unlink(), "watch:{h}/etc"),
        (lambda h: (h / "etc/ld.conf").write_text("/opt\n"), "watch:{h}/etc"),
        (lambda h: (h / "version").write_text("550.163.01\n"), "read:{h}/version"),
        (lambda h: (h / "version").unlink(), "read:{h}/version"),
    ],
    ids=[
        "file-gone",
        "link-moved",
        "mode",
        "size",
        "mtime",
        "file-added",
        "dir-renamed",
        "watched-file",
        "watched-file-gone",
        "watched-file-added",
        "read-content",
        "read-gone",
    ],
)
def test_a_change_where_a_stage_writes_runs_every_stage_and_clears_the_stamp(
    host: Path, change: Any, place: str
) -> None:
    stamp(host)
    change(host)
    result = check(host)
    assert result["converged"] is False
    assert result["differs"] == [place.format(h=host)]
    assert result["cleared"] is True
    assert not (host / "state/converged.json").exists()  # a run that stops half-way leaves none
    assert f"changed on the host since: {place.format(h=host).split(':', 1)[1]}" in result["why"]
    assert check(host)["why"].startswith("no stamp")


def _relink(link: Path, target: str) -> None:
    link.unlink()
    link.symlink_to(target)


def test_what_python_and_a_boot_write_on_their_own_does_not_count(host: Path) -> None:
    stamp(host)
    # Python's bytecode caches (written by an import, as verify's), a directory's own time, and a
    # change deeper than a watched directory's first level.
    cache = host / "trees/12.4.1/lib/__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"1")
    os.utime(host / "trees/12.4.1", ns=(5, 5))
    (host / "etc/profile.d/other.sh").write_text("true\n")
    # A watched file written again with the same bytes (a boot's apt settings, ldconfig's cache).
    (host / "etc/cuda.sh").write_text((host / "etc/cuda.sh").read_text())
    os.utime(host / "etc/cuda.sh", ns=(7, 7))
    assert check(host)["converged"] is True


def test_the_inputs_a_pending_reboot_and_converged_skip_each_run_every_stage(host: Path) -> None:
    stamp(host)
    result = check(host, inputs="digest-2")
    assert (result["converged"], result["differs"]) == (False, ["inputs"])
    assert result["why"] == "the declared settings or gpuenv's code changed: every stage runs"

    stamp(host)
    assert check(host, skip=False)["why"] == "converged_skip is false: every stage runs"
    assert not (host / "state/converged.json").exists()

    stamp(host)
    (host / "run").mkdir()
    (host / "run/reboot-required").write_text("")
    result = check(host)
    assert result["converged"] is False
    assert "run/reboot-required says the last run left work for the next" in result["why"]
    refused = stamp(host)
    assert (refused["stamped"], refused["converged"]) == (False, False)
    assert refused["why"].startswith("not stamped: ")
    assert not (host / "state/converged.json").exists()


@pytest.mark.parametrize(
    ("report", "said"),
    [
        (None, "no gpuenv verify report at"),
        ('{"exit_code": 1}', "the last gpuenv verify on the host failed (exit 1)"),
        ("{", "cannot be read"),
    ],
    ids=["missing", "failed", "unreadable"],
)
def test_a_host_whose_last_verify_did_not_pass_runs_every_stage(host: Path, report: str | None, said: str) -> None:
    # The run after a failed verify tries the stages again rather than skip to the same failure.
    stamp(host)
    if report is None:
        (host / "verify.json").unlink()
    else:
        (host / "verify.json").write_text(report)
    result = check(host)
    assert (result["converged"], result["cleared"]) == (False, True)
    assert said in result["why"]
    assert check(host, verify_report="")["why"].startswith("no stamp")  # none read, and the stamp is gone


def test_what_the_run_kept_comes_back_only_while_the_host_is_converged(host: Path) -> None:
    # The driver's package names, which a converged re-run reads from the stamp instead of planning.
    keep = {"nvidia_driver": {"main_package": "nvidia-driver", "pkg_mgr": "apt"}}
    stamp(host, keep=keep)
    again = check(host)
    assert (again["converged"], again["kept"], again["inputs"]) == (True, keep, "digest-1")
    (host / "etc/cuda.sh").write_text("changed\n")
    changed = check(host)  # the stamp, with what it kept, is still there when this reads it
    assert (changed["converged"], changed["cleared"], changed["kept"]) == (False, True, {})


def test_check_mode_reads_and_removes_nothing(host: Path) -> None:
    stamp(host)
    (host / "etc/cuda.sh").unlink()
    result = mod.run(params(host), True, None, no_systemctl)
    assert (result["converged"], result["cleared"]) == (False, False)
    assert (host / "state/converged.json").exists()
    assert mod.run(params(host, state="stamp", inputs="x"), True, None, no_systemctl)["stamped"] is False
    assert json.loads((host / "state/converged.json").read_text())["inputs"] == "digest-1"


def test_a_stamp_of_another_format_or_unreadable_is_no_stamp(host: Path) -> None:
    (host / "state").mkdir()
    for body in ("{", '{"format": 0, "inputs": "digest-1"}', "[]"):
        (host / "state/converged.json").write_text(body)
        assert check(host)["why"].startswith("no stamp")


def test_a_daemon_stopped_or_disabled_since_runs_every_stage(host: Path) -> None:
    states = {"nvidia-persistenced": ("active", "enabled"), "nvidia-fabricmanager": ("inactive", "")}
    calls: list[list[str]] = []

    def systemctl(args: list[str]) -> tuple[int, str, str]:
        # systemctl show's blocks, as it prints them for a unit that exists and one that does not.
        calls.append(args)
        blocks = [f"Id={u}.service\nActiveState={states[u][0]}\nUnitFileState={states[u][1]}\n" for u in args[4:]]
        return 0, "\n".join(blocks), ""

    units = ["nvidia-persistenced", "nvidia-fabricmanager"]
    mod.run(params(host, state="stamp", units=units), False, "/bin/systemctl", systemctl)
    assert mod.run(params(host, units=units), False, "/bin/systemctl", systemctl)["converged"] is True
    assert calls[0] == ["/bin/systemctl", "show", "--property=Id,ActiveState,UnitFileState", "--", *units]
    for changed in (("failed", "enabled"), ("active", "disabled")):
        states["nvidia-persistenced"] = changed
        result = mod.run(params(host, units=units), False, "/bin/systemctl", systemctl)
        assert (result["converged"], result["differs"]) == (False, ["units"]), changed
        states["nvidia-persistenced"] = ("active", "enabled")
        mod.run(params(host, state="stamp", units=units), False, "/bin/systemctl", systemctl)
    # Without systemd the units cannot be read, and count as such.
    assert fp.units_fingerprint(units, None, no_systemctl) == "no systemctl"


def test_globs_read_each_match_and_a_new_match_counts(host: Path) -> None:
    (host / "modules/6.1.0-18-amd64/updates").mkdir(parents=True)
    over = {"walk": [str(host / "modules/*/updates")]}
    stamp(host, **over)
    assert check(host, **over)["converged"] is True
    (host / "modules/6.1.0-21-amd64/updates").mkdir(parents=True)
    result = check(host, **over)
    assert result["differs"] == [f"walk:{host}/modules/6.1.0-21-amd64/updates"]


def ansible_module(args: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The module run by the ansible command on this machine, with ARGS."""
    local = ["localhost", "-c", "local", "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"]
    return run_tool("ansible", *local, "-m", "gpuenv_converged", "-a", json.dumps(args), env=env, timeout=120)


def test_the_real_module_runs_as_ansible_runs_it(host: Path, venv_env: dict[str, str]) -> None:
    args = params(host, state="stamp", read=[], units=["gpuenv-test-absent"], places={"read": [str(host / "version")]})
    out = ansible_module(args, venv_env)
    assert out.returncode == 0, out.stdout + out.stderr
    written = json.loads((host / "state/converged.json").read_text())
    assert written["format"] == mod.FORMAT
    assert f"read:{host / 'version'}" in written["fingerprint"]


def test_the_places_the_stages_declare_count_with_those_a_site_adds(host: Path) -> None:
    declared = {"watch": [str(host / "etc")], "read": [str(host / "version")], "pending": []}
    p = mod.merge_places(params(host, places=declared, read=[], walk=[str(host / "trees"), str(host / "trees")]))
    assert p["watch"] == [str(host / "etc")]  # declared and added: read once
    assert p["read"] == [str(host / "version")]
    assert p["walk"] == [str(host / "trees")]
    assert mod.run(p | {"state": "stamp"}, False, None, no_systemctl)["stamped"]
    (host / "version").write_text("550.54.15\n")  # a place only a stage role declared
    result = mod.run(p, False, None, no_systemctl)
    assert not result["converged"]
    assert result["differs"] == [f"read:{host / 'version'}"]


def test_a_place_of_an_unknown_kind_is_refused_by_name(host: Path, venv_env: dict[str, str]) -> None:
    args = params(host, places={"watch": [str(host / "etc")], "wach": ["/etc"]})
    out = ansible_module(args, venv_env)
    assert out.returncode != 0
    assert "wach" in out.stdout + out.stderr
