"""The gpuenv_apt_index module (plugins/modules): when it refreshes apt's index, and what it says
when a package is missing. run_command is replaced by a fake apt that answers from a scripted
index; the indextargets lines are apt 2.6's real output for the sources they name."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from tests.conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]
mod = load_plugin("plugins/modules/gpuenv_apt_index.py")

# `apt-get indextargets --no-release-info --format ...` on Debian 12 for
# "deb http://deb.debian.org/debian bookworm main non-free" and NVIDIA's flat repository.
INDEXTARGETS = """\
Packages\t{lists}/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages\thttp://deb.debian.org/debian/\tbookworm\tmain\tamd64\t/etc/apt/sources.list:1
Packages\t{lists}/deb.debian.org_debian_dists_bookworm_main_binary-all_Packages\thttp://deb.debian.org/debian/\tbookworm\tmain\tall\t/etc/apt/sources.list:1
Packages\t{lists}/deb.debian.org_debian_dists_bookworm_non-free_binary-amd64_Packages\thttp://deb.debian.org/debian/\tbookworm\tnon-free\tamd64\t/etc/apt/sources.list:1
Packages\t{lists}/deb.debian.org_debian_dists_bookworm_non-free_binary-all_Packages\thttp://deb.debian.org/debian/\tbookworm\tnon-free\tall\t/etc/apt/sources.list:1
Packages\t{lists}/developer.download.nvidia.com_compute_cuda_repos_debian12_x86%5f64_Packages\thttps://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/\t\t$(COMPONENT)\t$(ARCHITECTURE)\t/etc/apt/sources.list.d/cuda.list:1
"""
MADISON = (
    "nvidia-cuda-toolkit | 11.8.89~11.8.0-5~deb12u1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages\n"
)


class FakeApt:
    """apt-get indextargets/update and apt-cache madison over files in a temporary lists dir. An
    update "fetches" every index the current targets name, and afterwards madison offers what
    `offers_after_update` holds."""

    def __init__(
        self,
        root: Path,
        targets: str,
        offers_before: dict[str, str],
        offers_after: dict[str, str],
        *,
        never_fetched: tuple[str, ...] = (),
        locked_for: int = 0,
    ):
        self.lists = root / "lists"
        self.lists.mkdir()
        self.targets = targets.format(lists=self.lists)
        self.offers = offers_before
        self.offers_after = offers_after
        self.updates = 0
        self.never_fetched = never_fetched  # components the mirror does not carry
        self.locked_for = locked_for  # updates refused with apt's lock held

    def __call__(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        if argv[:2] == ["apt-get", "indextargets"]:
            return 0, self.targets, ""
        if argv[:2] == ["apt-get", "update"]:
            if self.locked_for > 0:
                self.locked_for -= 1
                return 100, "", "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 812 (apt-get)"
            self.updates += 1
            for target in mod.parse_indextargets(self.targets):
                if target["component"] not in self.never_fetched:
                    Path(target["filename"] + ".lz4").write_text("")
            self.offers = self.offers_after
            return 0, "", ""
        if argv[:2] == ["apt-cache", "madison"]:
            return 0, self.offers.get(argv[2], ""), ""
        raise AssertionError(f"unexpected command {argv}")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Module paths pointed into tmp_path: sources.list, the lists dir and the stamps."""
    (tmp_path / "periodic").mkdir()
    monkeypatch.setattr(mod, "STAMP", str(tmp_path / "periodic/gpuenv-update-stamp"))
    monkeypatch.setattr(mod, "APT_STAMP", str(tmp_path / "periodic/update-success-stamp"))
    monkeypatch.setattr(mod, "LISTS", str(tmp_path / "lists"))
    monkeypatch.setattr(mod, "SOURCES", (str(tmp_path / "sources.list"),))
    monkeypatch.setattr(mod, "RETRIES_CONF", str(tmp_path / "80gpuenv-retries"))
    return tmp_path


def _run(apt: FakeApt, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], **args: Any) -> Any:
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: apt(argv, **kw))
    with patch_module_args(args), pytest.raises(SystemExit):
        mod.main()
    return json.loads(capsys.readouterr().out)


def _fetched(apt: FakeApt, *, age: float, sources_age: float, host: Path) -> None:
    """Every non-optional index present, the last refresh `age` seconds ago, the sources older."""
    for target in mod.parse_indextargets(apt.targets):
        if target["arch"] != "all":
            Path(target["filename"] + ".lz4").write_text("")
    stamp = host / "periodic/gpuenv-update-stamp"
    stamp.write_text("")
    now = time.time()
    os.utime(stamp, (now - age, now - age))
    (host / "sources.list").write_text("deb http://deb.debian.org/debian bookworm main non-free\n")
    os.utime(host / "sources.list", (now - sources_age, now - sources_age))


def test_parses_apts_own_lines_and_fields_it_leaves_blank() -> None:
    targets = mod.parse_indextargets(INDEXTARGETS.format(lists="/var/lib/apt/lists"))
    assert [(t["suite"], t["component"], t["arch"]) for t in targets] == [
        ("bookworm", "main", "amd64"),
        ("bookworm", "main", "all"),
        ("bookworm", "non-free", "amd64"),
        ("bookworm", "non-free", "all"),
        ("", "", ""),
    ]
    assert targets[4]["entry"] == "/etc/apt/sources.list.d/cuda.list:1"


def test_a_component_added_within_the_hour_is_fetched_before_the_answer(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The debootstrap root's case: main was fetched a minute ago, non-free never.
    apt = FakeApt(host, INDEXTARGETS, {}, {"nvidia-cuda-toolkit": MADISON})
    _fetched(apt, age=60, sources_age=3000, host=host)
    for name in apt.lists.glob("*non-free*"):
        name.unlink()
    # retries=0: apt's retry setting (the one change the module makes) is another test's subject.
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], component="non-free", retries=0)
    assert apt.updates == 1
    assert out["refreshed"][0].startswith("no index yet for http://deb.debian.org/debian/ bookworm/non-free")
    assert out["madison"]["nvidia-cuda-toolkit"] == MADISON
    assert out["missing"] == []
    assert out["changed"] is False


def test_a_sources_file_changed_after_the_refresh_refreshes(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {"nvidia-cuda-toolkit": MADISON}, {"nvidia-cuda-toolkit": MADISON})
    _fetched(apt, age=600, sources_age=10, host=host)
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"])
    assert apt.updates == 1
    assert out["refreshed"] == [f"{host / 'sources.list'} changed after the last refresh"]


def test_a_current_index_is_not_refreshed(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {"nvidia-cuda-toolkit": MADISON}, {})
    _fetched(apt, age=600, sources_age=3000, host=host)
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], optional=["nvidia-driver-pinning-580"])
    assert apt.updates == 0
    assert out["refreshed"] == []
    # An optional package nothing offers is no reason to refresh and is not called missing.
    assert out["madison"]["nvidia-driver-pinning-580"] == ""
    assert out["missing"] == []


def test_an_old_index_or_cache_valid_time_zero_refreshes(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {"nvidia-cuda-toolkit": MADISON}, {"nvidia-cuda-toolkit": MADISON})
    _fetched(apt, age=600, sources_age=3000, host=host)
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], cache_valid_time=0)
    assert apt.updates == 1
    assert out["refreshed"] == ["the index is older than 0 s"]


def test_a_missing_package_refreshes_once_more_then_says_what_is_missing(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    only_main = "".join(line + "\n" for line in INDEXTARGETS.splitlines()[:2])
    apt = FakeApt(host, only_main, {}, {})
    _fetched(apt, age=600, sources_age=3000, host=host)
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], component="non-free")
    assert apt.updates == 1
    assert out["refreshed"] == ["nvidia-cuda-toolkit not in the index"]
    assert out["missing"] == ["nvidia-cuda-toolkit"]
    why = out["why"]["nvidia-cuda-toolkit"]
    assert "'non-free' component, which the apt sources do not enable for http://deb.debian.org/debian/ bookworm" in why
    assert "/etc/apt/sources.list" in why


def test_a_repository_the_sources_lack_is_named(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    only_main = "".join(line + "\n" for line in INDEXTARGETS.splitlines()[:2])
    apt = FakeApt(host, only_main, {}, {})
    _fetched(apt, age=600, sources_age=3000, host=host)
    mirror = "http://mirror.example/cuda/debian12/x86_64/"
    out = _run(apt, monkeypatch, capsys, packages=["cuda-toolkit-12-4"], repository=mirror)
    assert out["why"]["cuda-toolkit-12-4"].startswith(
        f"cuda-toolkit-12-4 is not offered: the apt sources do not include the repository {mirror}"
    )


def test_a_package_the_repositories_lack_says_what_was_searched(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {}, {})
    _fetched(apt, age=600, sources_age=3000, host=host)
    repo = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"
    out = _run(apt, monkeypatch, capsys, packages=["libcudnn9-cuda-12"], repository=repo, component="non-free")
    why = out["why"]["libcudnn9-cuda-12"]
    assert why.startswith("libcudnn9-cuda-12 is not offered by any repository in the apt sources, even after a refresh")
    assert "http://deb.debian.org/debian/ bookworm/non-free" in why
    assert repo + "/" in why


def test_a_failed_update_fails_with_apts_message(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {}, {})

    def failing(argv: list[str], **kw: Any) -> tuple[int, str, str]:
        if argv[:2] == ["apt-get", "update"]:
            return 100, "", "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease"
        return apt(argv, **kw)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: failing(argv, **kw))
    with patch_module_args({"packages": ["nvidia-cuda-toolkit"]}), pytest.raises(SystemExit):
        mod.main()
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] is True
    assert "apt-get update failed on this host (rc 100): E: Failed to fetch" in out["msg"]


def test_an_index_no_refresh_can_fetch_does_not_refresh_every_run(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The mirror carries no non-free: the first run refreshes and remembers that; the next does not.
    apt = FakeApt(
        host, INDEXTARGETS, {"bash": "bash | 5.2 | x"}, {"bash": "bash | 5.2 | x"}, never_fetched=("non-free",)
    )
    (host / "sources.list").write_text("deb http://deb.debian.org/debian bookworm main non-free\n")
    old = time.time() - 3000
    os.utime(host / "sources.list", (old, old))
    first = _run(apt, monkeypatch, capsys, packages=["bash"])
    assert first["refreshed"][0].startswith("no index yet for")
    second = _run(apt, monkeypatch, capsys, packages=["bash"])
    assert apt.updates == 1
    assert second["refreshed"] == []
    # A change of the sources makes it worth trying again.
    (host / "sources.list").write_text("deb http://deb.debian.org/debian bookworm main non-free contrib\n")
    third = _run(apt, monkeypatch, capsys, packages=["bash"])
    assert apt.updates == 2
    assert any("changed after the last refresh" in r for r in third["refreshed"])


def test_a_held_apt_lock_is_waited_for(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {}, {"nvidia-cuda-toolkit": MADISON}, locked_for=2)
    monkeypatch.setattr(mod.time, "sleep", lambda seconds: None)
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"])
    assert apt.updates == 1
    assert out["madison"]["nvidia-cuda-toolkit"] == MADISON


def test_apts_retries_are_written_once_and_check_mode_only_reports_them(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A dropped link during a package download: apt tries again, for the
    # packages the roles install after this module, which Ansible's apt module cannot tell.
    apt = FakeApt(host, INDEXTARGETS, {"nvidia-cuda-toolkit": MADISON}, {"nvidia-cuda-toolkit": MADISON})
    _fetched(apt, age=60, sources_age=3000, host=host)
    conf = host / "80gpuenv-retries"
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], retries=5, _ansible_check_mode=True)
    assert out["changed"] is True
    assert not conf.exists()
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], retries=5)
    assert out["changed"] is True
    assert 'Acquire::Retries "5";' in conf.read_text()
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], retries=5)
    assert out["changed"] is False
    out = _run(apt, monkeypatch, capsys, packages=["nvidia-cuda-toolkit"], retries=0)
    assert out["changed"] is False
    assert 'Acquire::Retries "5";' in conf.read_text()  # 0 leaves apt's setting as it is


# `apt-cache madison libcuda1` on a Debian 13 host with the sandbox's copy of NVIDIA's repository:
# Debian's own 550.163.01-2 is higher than NVIDIA's 550.163.01-1.
MADISON_LIBCUDA1 = (
    "  libcuda1 | 550.163.01-2 | http://deb.debian.org/debian trixie/non-free amd64 Packages\n"
    "  libcuda1 | 550.163.01-1 | http://10.199.0.1:8000/compute/cuda/repos/debian13/x86_64  Packages\n"
)


def test_only_the_repository_s_versions_when_debian_has_the_same_names_higher(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apt = FakeApt(host, INDEXTARGETS, {"libcuda1": MADISON_LIBCUDA1, "cuda-drivers": ""}, {})
    _fetched(apt, age=600, sources_age=3000, host=host)
    repo = "http://10.199.0.1:8000/compute/cuda/repos/debian13/x86_64/"
    out = _run(apt, monkeypatch, capsys, packages=["libcuda1"], repository=repo, only_repository=True)
    assert out["madison"]["libcuda1"] == MADISON_LIBCUDA1.splitlines(keepends=True)[1]
    assert hostparse.pin_choice(out["madison"]["libcuda1"], "550")["version"] == "550.163.01-1"
    # Without the option every repository's versions, the highest Debian's.
    out = _run(apt, monkeypatch, capsys, packages=["libcuda1"], repository=repo)
    assert hostparse.pin_choice(out["madison"]["libcuda1"], "550")["version"] == "550.163.01-2"
    # A name only another repository offers is missing from this one, and says where it looked.
    apt.offers = {"libcuda1": MADISON_LIBCUDA1.splitlines(keepends=True)[0]}
    out = _run(apt, monkeypatch, capsys, packages=["libcuda1"], repository=repo, only_repository=True)
    assert out["missing"] == ["libcuda1"]
