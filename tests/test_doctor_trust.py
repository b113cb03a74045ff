"""gpuenv doctor as root never runs what another account can write: an account's own environment runs
as that account (setpriv, no capabilities, a scrubbed environment), one that root owns but another
account can change is only read, and no root run takes LD_LIBRARY_PATH from another account's shell
files. The fake hosts are trees whose files are chowned to other uids, so these tests need root (the
suite runs as root; elsewhere they are skipped, saying so); the last runs a planted Python for real."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.compat import load
from gpuenv.doctor import envs, trust, verifyrun
from gpuenv.doctor import report as doctor_report
from gpuenv.doctor.envs import Env, LibPath
from gpuenv.doctor.host import Host
from gpuenv.doctor.run import Options, examine
from tests.doctor_hosts import FakeHost, data, done, report, venv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to other accounts: needs root")

EVE, MALLORY = 4242, 4343
PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    f"eve:x:{EVE}:{EVE}::/home/eve:/bin/bash\n"
    f"mallory:x:{MALLORY}:{MALLORY}::/home/mallory:/bin/bash\n"
)
GROUP = f"root:x:0:\neve:x:{EVE}:\nmallory:x:{MALLORY}:\n"


def _chown(fh: FakeHost, path: str, uid: int) -> None:
    top = fh.path(path)
    for entry in [top, *top.rglob("*")]:
        os.lchown(entry, uid, uid)


def _host(tmp_path: Path) -> FakeHost:
    """A Debian host with two accounts besides root, Debian's Python, and a verify that passes."""
    fh = FakeHost(tmp_path / "root")
    fh.write("/etc/passwd", PASSWD)
    fh.write("/etc/group", GROUP)
    fh.write("/etc/os-release", data("os-release-debian12"))
    fh.tool("/usr/bin/python3.11")
    fh.link("/usr/bin/python3", "python3.11")
    fh.write("/usr/lib/python3.11/os.py", "")
    fh.tool("/usr/bin/setpriv", ("*", done(json.dumps(report()), 0)))
    fh.tool("/usr/bin/env")
    for tool in ("ldconfig", "nvidia-smi", "lspci", "dpkg-query", "modinfo"):
        fh.tool(f"/usr/sbin/{tool}", ("*", done("", 1)))
    fh.write("/home/mallory/.bashrc", "export LD_LIBRARY_PATH=/home/mallory/lib:$LD_LIBRARY_PATH\n")
    fh.write("/home/mallory/lib/libcudnn.so.9", "ELF stand-in\n")
    _chown(fh, "/home/mallory", MALLORY)
    return fh


def _eve_venv(fh: FakeHost, prefix: str = "/home/eve/venv") -> str:
    venv(fh, prefix, "2.5.1+cu124", ("nvidia-cudnn-cu12", "9.20.0.48"), home="/usr/bin")
    fh.write("/home/eve/.bashrc", "export LD_LIBRARY_PATH=/home/eve/cuda/lib\n")
    _chown(fh, "/home/eve", EVE)
    return prefix


def _calls(fh: FakeHost) -> list[list[str]]:
    return [argv for argv, _ in fh.calls]


def _diagnose(fh: FakeHost, **kwargs: object) -> tuple[list[Env], str]:
    host = fh.host(home="/root", uid=0)
    found = examine(host, load(), Options(**kwargs))  # type: ignore[arg-type]
    return found.envs, doctor_report.as_json(found, load())


def test_an_account_s_own_venv_runs_as_that_account_with_its_own_library_path(tmp_path: Path) -> None:
    fh = _host(tmp_path)
    prefix = _eve_venv(fh)
    [env], as_json = _diagnose(fh)
    python = f"{prefix}/bin/python"
    assert all(argv[0] != python for argv in _calls(fh)), "eve's Python ran as root"
    [(argv, environ)] = [(a, e) for a, e in fh.calls if python in a]
    drop = ["--reuid=4242", "--regid=4242", "--init-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    assert argv[:8] == ["/usr/bin/setpriv", *drop, "--"]
    # env(1) sets the library path after the drop: setpriv itself, root until then, never sees it.
    assert argv[8:11] == ["/usr/bin/env", "LD_LIBRARY_PATH=/home/eve/cuda/lib", python]
    assert environ is not None
    assert "LD_LIBRARY_PATH" not in environ
    assert (environ["HOME"], environ["USER"]) == ("/home/eve", "eve")
    assert "/home/mallory/lib" not in " ".join(argv)
    assert env.verify is not None
    assert env.verify["exit_code"] == 0
    assert env.verify_as.startswith("ran as eve (uid 4242), its owner, without capabilities")
    assert json.loads(as_json)["environments"][0]["verify_as"] == env.verify_as


def test_a_conda_env_named_by_an_account_s_condarc_runs_as_that_account(tmp_path: Path) -> None:
    fh = _host(tmp_path)
    prefix = "/home/eve/conda-envs/ml"
    fh.write("/home/eve/.condarc", "envs_dirs:\n  - ~/conda-envs\n")
    fh.write(f"{prefix}/conda-meta/python-3.12.7-h_0.json", json.dumps({"name": "python", "version": "3.12.7"}))
    fh.write(f"{prefix}/lib/python3.12/site-packages/torch/version.py", data("torch-version-2.5.1+cu124.txt"))
    fh.tool(f"{prefix}/bin/python")
    _chown(fh, "/home/eve", EVE)
    [env], _ = _diagnose(fh)
    assert env.path == prefix
    assert all(argv[0] != f"{prefix}/bin/python" for argv in _calls(fh))
    assert any(argv[:2] == ["/usr/bin/setpriv", "--reuid=4242"] for argv in _calls(fh))


@pytest.mark.parametrize(
    ("plant", "reason"),
    [
        ("pth-group", "evil.pth is writable by group eve"),
        ("pth-owned", "evil.pth is owned by eve"),
        ("dir-world", "site-packages is writable by every account"),
        ("python-link", "/home/eve/python3 is owned by eve"),
        ("sitecustomize", "sitecustomize.py is owned by eve"),
    ],
)
def test_a_root_env_another_account_can_change_is_read_not_run(tmp_path: Path, plant: str, reason: str) -> None:
    fh = _host(tmp_path)
    prefix = "/opt/envs/team"
    venv(fh, prefix, "2.5.1+cu124", ("nvidia-cudnn-cu12", "9.20.0.48"), home="/usr/bin")
    site = f"{prefix}/lib/python3.11/site-packages"
    if plant.startswith("pth"):
        fh.write(f"{site}/evil.pth", "import os; os.system('id')\n")
        if plant == "pth-group":
            os.chown(fh.path(f"{site}/evil.pth"), 0, EVE)
            fh.path(f"{site}/evil.pth").chmod(0o664)
        else:
            os.chown(fh.path(f"{site}/evil.pth"), EVE, EVE)
    elif plant == "dir-world":
        fh.path(site).chmod(0o777)
    elif plant == "python-link":
        fh.write("/home/eve/python3", "#!/bin/sh\n", 0o755)
        _chown(fh, "/home/eve", EVE)
        fh.path(f"{prefix}/bin/python").unlink()
        fh.link(f"{prefix}/bin/python", "/home/eve/python3")
    else:
        fh.write("/usr/lib/python3.11/sitecustomize.py", "import os\n")
        os.chown(fh.path("/usr/lib/python3.11/sitecustomize.py"), EVE, EVE)
    [env], _ = _diagnose(fh, envs=[prefix])
    assert not any(f"{prefix}/bin/python" in argv for argv in _calls(fh)), (
        "an environment another account can change ran"
    )
    assert env.verify is None
    assert env.verify_as.startswith("not run (read from its files only)")
    assert reason in env.verify_as
    # Read from its files all the same.
    assert (env.torch, env.cudnn) == ("2.5.1+cu124", "9.20.0.48")


def test_a_root_env_runs_as_root_with_the_system_s_library_path_and_no_other_account_s(tmp_path: Path) -> None:
    fh = _host(tmp_path)
    prefix = "/opt/gpuenv/envs/default"
    venv(fh, prefix, "2.5.1+cu124", ("nvidia-cudnn-cu12", "9.20.0.48"), home="/usr/bin")
    fh.tool(f"{prefix}/bin/python", ("*", done(json.dumps(report()), 0)))
    fh.write("/etc/profile.d/cuda.sh", "export LD_LIBRARY_PATH=/usr/local/cuda/lib64\n")
    fh.write("/root/.bashrc", "export LD_LIBRARY_PATH=/root/lib:$LD_LIBRARY_PATH\n")
    fh.write("/usr/local/cuda/lib64/.keep")
    fh.write("/root/lib/.keep")
    [env], _ = _diagnose(fh)
    [environ] = [e for a, e in fh.calls if a[0] == f"{prefix}/bin/python"]
    assert environ is not None
    assert environ["LD_LIBRARY_PATH"].split(":") == ["/usr/local/cuda/lib64", "/root/lib"]
    assert env.verify_as.startswith("ran as root: nothing it runs or loads")


def test_a_library_directory_another_account_can_write_keeps_root_from_running_it(tmp_path: Path) -> None:
    fh = _host(tmp_path)
    prefix = "/opt/gpuenv/envs/default"
    venv(fh, prefix, "2.5.1+cu124", None, home="/usr/bin")
    fh.write("/etc/profile.d/cuda.sh", "export LD_LIBRARY_PATH=/usr/local/cuda/lib64\n")
    fh.write("/usr/local/cuda/lib64/libcudnn.so.9", "ELF stand-in\n")
    os.chown(fh.path("/usr/local/cuda/lib64"), EVE, EVE)
    [env], _ = _diagnose(fh)
    assert env.verify is None
    assert "/usr/local/cuda/lib64 is owned by eve" in env.verify_as
    # The loader's cache names such a directory too: torch maps libcudnn by name from it.
    host = fh.host(home="/root", uid=0)
    clean = Env(path=prefix, kind="venv", python=f"{prefix}/bin/python", python_version="3.11")
    assert trust.root_writer(host, clean, [], {}) is None
    cached = {"libcudnn.so.9": ["/usr/local/cuda/lib64/libcudnn.so.9"]}
    assert trust.root_writer(host, clean, [], cached) == "/usr/local/cuda/lib64 is owned by eve"


def test_an_account_without_a_passwd_entry_is_read_not_run(tmp_path: Path) -> None:
    fh = _host(tmp_path)
    prefix = "/srv/orphan/venv"
    venv(fh, prefix, "2.5.1+cu124", None, home="/usr/bin")
    _chown(fh, "/srv/orphan", 5151)
    [env], _ = _diagnose(fh, envs=[prefix])
    assert env.verify is None
    assert "uid 5151 has no account to run it as" in env.verify_as


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every account can reach (pytest's own is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="gpuenv-trust-", dir="/var/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_planted_python_runs_as_its_owner_never_as_root(shared_dir: Path) -> None:
    """For real, on this machine: nobody's venv with a bin/python that notes who ran it."""
    nobody = pwd.getpwnam("nobody")
    prefix = shared_dir / "venv"
    site = prefix / "lib/python3.11/site-packages/torch"
    site.mkdir(parents=True)
    (site / "version.py").write_text("__version__ = '2.5.1+cpu'\ncuda = None\n")
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    marker = prefix / "ran-as"
    (prefix / "bin").mkdir()
    (prefix / "bin/python").write_text(
        f'#!/bin/sh\n{{ id -u; id -G; echo "LD=$LD_LIBRARY_PATH"; }} > {marker}\nexit 3\n'
    )
    (prefix / "bin/python").chmod(0o755)
    for entry in [prefix, *prefix.rglob("*")]:
        os.lchown(entry, nobody.pw_uid, nobody.pw_gid)
    host = Host(environ={"PATH": "/usr/bin:/bin", "HOME": "/root", "LD_LIBRARY_PATH": "/root/secret"})
    env = envs.describe(host, Env(path=str(prefix), kind="venv"))
    session = [LibPath("/home/mallory/.bashrc", ["/home/mallory/lib"])]
    how, ld_path = verifyrun.plan(host, env, session, {})
    assert (how.how, how.uid) == (trust.OWNER, nobody.pw_uid)
    result = verifyrun.run(host, env, Path("/nonexistent.pyz"), how, ld_path, 30)
    uid, groups, ld = marker.read_text().splitlines()
    assert uid == str(nobody.pw_uid) != "0"
    assert "0" not in groups.split()
    assert ld == "LD="  # neither root's own value nor another account's shell files
    assert result["exit_code"] != 0  # the planted Python printed no report: a failing one, as for any
    status = subprocess.run(["stat", "-c", "%u", str(marker)], capture_output=True, text=True, check=True)  # noqa: S607
    assert status.stdout.strip() == str(nobody.pw_uid)
