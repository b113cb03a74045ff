"""The gpuenv_cuda_tree module (plugins/modules): a CUDA tree's cuDNN changes by switching the
tree's link to a complete new tree, from either tarball layout, and every way back is kept. Its
archive and tree helpers (plugins/module_utils/gpuenv_cudnn_files.py) are tested in
test_cudnn_files.py; the tarballs and trees both use are made in cudnn_tarballs.py."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from tests.cudnn_tarballs import LIBS_8, call, cudnn_args, files, header, make_host, make_toolkit
from tests.cudnn_tarballs import mod as tree_mod


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    return make_host(tmp_path)


# --- the switch --------------------------------------------------------------------------------
@pytest.mark.parametrize("legacy", [True, False])
def test_cudnn_lands_in_a_new_tree_and_the_link_switches_to_it(
    host: dict[str, Path], legacy: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=legacy)
    cudart = host["base"] / "lib/libcudart.so.11.8.89"
    before = cudart.stat().st_ino
    out, ran = call(monkeypatch, capsys, **args)
    assert out["changed"], out
    tree = Path(os.readlink(host["link"]))
    assert tree == Path(f"{host['base']}+cudnn-8.6.0.163-{args['cudnn_sha256'][:12]}")
    assert out["tree"] == str(tree)
    assert out["previous"] == str(host["base"])
    # NVIDIA's guide: headers into include, libraries into lib64 with their links, a+r.
    assert hostparse.cudnn_header_version((tree / "include/cudnn_version.h").read_text()) == "8.6.0"
    assert os.readlink(tree / "lib64/libcudnn_cnn_infer.so.8") == "libcudnn_cnn_infer.so.8.6.0"
    for name in LIBS_8:
        mode = (tree / f"lib/{name}.so.8.6.0").stat().st_mode
        assert mode & 0o444 == 0o444
        assert mode & 0o022 == 0
    # The toolkit's files are the same files (hard links), and the toolkit tree itself is untouched.
    assert (tree / "lib/libcudart.so.11.8.89").stat().st_ino == before
    assert not list(host["base"].glob("include/cudnn*"))
    assert not list(host["base"].glob("lib/libcudnn*"))
    assert out["cudnn"]["base"] == str(host["base"])
    assert out["cudnn"]["layout"] == (files.LEGACY if legacy else files.REDIST)
    assert "lib64/libcudnn_adv_train.so.8" in out["cudnn"]["files"]
    assert out["diff"]["after"].startswith(str(tree))
    assert ran.commands == [["ldconfig"]]
    assert not Path(args["cudnn_archive"]).exists()  # unpacked once, kept unpacked

    again, ran = call(monkeypatch, capsys, **args)
    assert again["changed"] is False
    assert ran.commands == []


def test_check_mode_says_what_would_change_and_changes_nothing(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=True)
    out, ran = call(monkeypatch, capsys, check=True, **args)
    assert out["changed"]
    assert out["diff"]["before"].startswith(f"{host['base']} (cuDNN none)")
    assert "(cuDNN 8.6.0.163)" in out["diff"]["after"]
    assert os.readlink(host["link"]) == str(host["base"])
    assert sorted(p.name for p in host["root"].iterdir()) == [host["base"].name]
    assert ran.commands == []
    assert Path(args["cudnn_archive"]).exists()


def test_another_cudnn_keeps_the_previous_tree_and_going_back_needs_no_tarball(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = cudnn_args(host, "8.6.0.163", legacy=True)
    call(monkeypatch, capsys, **first)
    tree_a = os.readlink(host["link"])
    second = cudnn_args(host, "8.9.7.29", legacy=False)
    out, _ = call(monkeypatch, capsys, **second)
    assert out["previous"] == tree_a
    tree_b = os.readlink(host["link"])
    assert Path(tree_a).is_dir()  # the way back, for fleet_upgrade's rollback
    assert hostparse.cudnn_header_version(Path(tree_b, "include/cudnn_version.h").read_text()) == "8.9.7"
    # Back to the first: its tarball is gone, its unpacked copy and its tree are there.
    back = {**first, "cudnn_archive": None}
    out, _ = call(monkeypatch, capsys, **{k: v for k, v in back.items() if v is not None})
    assert out["changed"]
    assert os.readlink(host["link"]) == tree_a
    assert Path(tree_b).is_dir()
    # A third change prunes what is neither the link's tree nor the way back.
    third = cudnn_args(host, "8.5.0.96", legacy=False)
    out, _ = call(monkeypatch, capsys, **third)
    assert out["removed"] == [tree_b]
    assert Path(tree_a).is_dir()


def test_a_toolkit_update_carries_the_cudnn_without_its_tarball(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=True)
    call(monkeypatch, capsys, **args)
    old = os.readlink(host["link"])
    new_base = make_toolkit(host["root"], "11.8.0-fedcba987654")
    out, _ = call(monkeypatch, capsys, link=host["link"], base=new_base, carry_cudnn=True, prune_versions=True,
                  unpack_dir=host["downloads"] / "unpacked")  # fmt: skip
    assert out["changed"]
    tree = Path(os.readlink(host["link"]))
    assert tree.name == f"11.8.0-fedcba987654+cudnn-8.6.0.163-{args['cudnn_sha256'][:12]}"
    assert (tree / "lib64/libcudnn.so.8").exists()
    assert out["previous"] == old
    assert Path(old).is_dir()  # the way back
    assert host["base"].is_dir()  # and its toolkit
    # Without carry_cudnn the same call leaves the bare toolkit, as a stack without cuDNN wants.
    out, _ = call(monkeypatch, capsys, link=host["link"], base=new_base, unpack_dir=host["downloads"] / "unpacked")
    assert os.readlink(host["link"]) == str(new_base)


def test_a_run_killed_while_the_cudnn_is_placed_leaves_the_active_tree_whole(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = cudnn_args(host, "8.6.0.163", legacy=True)
    call(monkeypatch, capsys, **first)
    active = os.readlink(host["link"])
    second = cudnn_args(host, "8.9.7.29", legacy=False)
    real_replace = os.replace
    calls = {"n": 0}

    def killed(src: str, dest: str) -> None:
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("killed")  # the process dies half-way through the copy
        real_replace(src, dest)

    monkeypatch.setattr(os, "replace", killed)
    out, _ = call(monkeypatch, capsys, **second)
    assert out["failed"]
    monkeypatch.setattr(os, "replace", real_replace)
    assert os.readlink(host["link"]) == active
    assert hostparse.cudnn_header_version(Path(active, "include/cudnn_version.h").read_text()) == "8.6.0"
    assert len(list(Path(active).glob("lib/libcudnn*"))) == 3 * len(LIBS_8)
    out, _ = call(monkeypatch, capsys, **{**second, "cudnn_archive": second["cudnn_archive"]})
    assert out["changed"]
    assert "8.9.7.29" in os.readlink(host["link"])
    assert not list(host["root"].glob(".staging-*"))


def test_a_second_run_waits_for_one_still_placing_on_the_host(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run killed on the controller can leave its module running on the host; the rerun must not
    # unpack and switch beside it (two unpacks into one directory collide: "File exists").
    args = cudnn_args(host, "8.6.0.163", legacy=False)
    unpack_dir = Path(args["unpack_dir"])
    unpack_dir.mkdir(parents=True)
    got: dict[str, object] = {}
    with (unpack_dir / ".lock").open("a") as other_run:
        fcntl.flock(other_run, fcntl.LOCK_EX)
        second = threading.Thread(target=lambda: got.update(out=call(monkeypatch, capsys, **args)[0]))
        second.start()
        time.sleep(0.5)
        assert second.is_alive()  # waiting for the other run
        assert os.readlink(host["link"]) == str(host["base"])
        assert not list(unpack_dir.glob("*.partial"))
    second.join(30)
    out = got["out"]
    assert isinstance(out, dict), out
    assert out["changed"], out
    assert "8.6.0.163" in os.readlink(host["link"])


def test_a_tarball_that_is_not_the_declared_release_is_refused(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=True)
    out, _ = call(monkeypatch, capsys, **{**args, "cudnn_version": "8.2.1.32"})
    assert out["failed"]
    assert "holds cuDNN 8.6.0, not 8.2.1.32" in out["msg"]
    args = cudnn_args(host, "8.6.0.163", legacy=True, name="other.tgz")
    out, _ = call(monkeypatch, capsys, **{**args, "cudnn_sha256": "0" * 64})
    assert f"sha256 is {args['cudnn_sha256']}, expected {'0' * 64}" in out["msg"]
    assert os.readlink(host["link"]) == str(host["base"])


def test_a_missing_tree_says_to_install_the_toolkit_unless_nothing_is_wanted_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    h = {"link": tmp_path / "cuda-11.8", "downloads": tmp_path}
    out, _ = call(monkeypatch, capsys, **cudnn_args(h, "8.6.0.163", legacy=True))
    assert out["failed"]
    assert "no CUDA tree at" in out["msg"]
    assert "install the toolkit first" in out["msg"]
    out, _ = call(monkeypatch, capsys, link=tmp_path / "cuda-11.8")
    assert out["changed"] is False
    assert out["mode"] == "absent"


def test_a_toolkits_first_link_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = make_toolkit(tmp_path / "opt")
    out, ran = call(monkeypatch, capsys, link=tmp_path / "cuda-11.8", base=base, carry_cudnn=True)
    assert out["changed"]
    assert os.readlink(tmp_path / "cuda-11.8") == str(base)
    assert ran.commands == [["ldconfig"]]
    assert call(monkeypatch, capsys, link=tmp_path / "cuda-11.8", base=base, carry_cudnn=True)[0]["changed"] is False


# --- trees gpuenv did not make, and trees the earlier role filled ------------------------------
def test_a_real_directory_gets_the_files_in_place_and_loses_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # NVIDIA's packages make /usr/local/cuda-X.Y a directory: nothing to switch.
    tree = make_toolkit(tmp_path, "cuda-11.8")
    h = {"link": tree, "downloads": tmp_path}
    args = cudnn_args(h, "8.6.0.163", legacy=True)
    out, ran = call(monkeypatch, capsys, **args)
    assert out["mode"] == "in_place"
    assert out["changed"]
    assert os.readlink(tree / "lib/libcudnn.so.8") == "libcudnn.so.8.6.0"
    assert ran.commands == [["ldconfig"]]
    assert call(monkeypatch, capsys, **args)[0]["changed"] is False
    out, _ = call(monkeypatch, capsys, link=tree, unpack_dir=tmp_path / "unpacked")
    assert out["changed"]
    assert not list(tree.glob("lib/libcudnn*"))
    assert not list(tree.glob("include/cudnn*"))
    assert (tree / "lib/libcudart.so.11.8.89").exists()


def test_a_tree_the_earlier_role_filled_is_emptied_after_the_switch(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # gpuenv's earlier cudnn role copied cuDNN into the toolkit tree and recorded it without a base.
    base = host["base"]
    (base / "include/cudnn_version.h").write_bytes(header("9.1.0.70"))
    (base / "lib/libcudnn.so.9.1.0").write_text("old\n")
    (base / "lib/libcudnn.so.9").symlink_to("libcudnn.so.9.1.0")
    (base / ".gpuenv-cudnn.json").write_text(json.dumps({"version": "9.1.0.70", "sha256": "ab" * 32,
        "files": ["include/cudnn_version.h", "lib64/libcudnn.so.9", "lib64/libcudnn.so.9.1.0"]}))  # fmt: skip
    # A toolkit update with carry leaves that tree alone until the cudnn role runs.
    out, _ = call(monkeypatch, capsys, link=host["link"], carry_cudnn=True, unpack_dir=host["downloads"] / "u")
    assert out["changed"] is False
    args = cudnn_args(host, "8.6.0.163", legacy=False)
    out, _ = call(monkeypatch, capsys, **args)
    tree = Path(os.readlink(host["link"]))
    assert not (tree / "lib/libcudnn.so.9.1.0").exists()
    assert (tree / "lib/libcudnn.so.8.6.0").exists()
    assert not (base / "lib/libcudnn.so.9.1.0").exists()
    assert not (base / ".gpuenv-cudnn.json").exists()
    assert (base / "lib/libcudart.so.11.8.89").exists()


# --- a tree damaged since it was placed -----------------------------------------------------------
def _placed(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], Path]:
    args = cudnn_args(host, "8.6.0.163", legacy=False)
    call(monkeypatch, capsys, **args)
    return {k: v for k, v in args.items() if k != "cudnn_archive"}, Path(os.readlink(host["link"]))


def test_the_recipes_chmod_a_r_undone_is_seen_and_put_back_without_the_tarball(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args, tree = _placed(host, monkeypatch, capsys)
    lib = tree / "lib64/libcudnn_cnn_infer.so.8.6.0"
    lib.chmod(0o600)
    plan, _ = call(monkeypatch, capsys, check=True, **args)
    assert plan["needed"] is True
    assert plan["damage"] == [
        "lib64/libcudnn_cnn_infer.so.8.6.0: mode 0600, not readable by all or writable by others than root"
    ]
    # The unpacked copy shares the file (a hard link): its mode is put back, nothing is fetched.
    assert plan["unpacked"] is True
    assert "mode 0600" in plan["diff"]["before"]
    out, ran = call(monkeypatch, capsys, **args)
    assert out["changed"] is True, out
    assert Path(os.readlink(host["link"])) == tree
    assert (tree / "lib64/libcudnn_cnn_infer.so.8.6.0").stat().st_mode & 0o777 == 0o644
    assert ran.commands == [["ldconfig"]]
    again, _ = call(monkeypatch, capsys, **args)
    assert (again["changed"], again["damage"]) == (False, [])


def test_a_deleted_header_and_a_library_put_in_by_hand_are_rebuilt_from_the_unpacked_copy(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args, tree = _placed(host, monkeypatch, capsys)
    (tree / "include/cudnn_version.h").unlink()
    (tree / "lib64/libcudnn.so.7").write_bytes(b"an old cuDNN copied in by hand")
    plan, _ = call(monkeypatch, capsys, check=True, **args)
    assert sorted(plan["damage"]) == [
        "include/cudnn_version.h: missing",
        "lib/libcudnn.so.7: a cuDNN file gpuenv did not place",
    ]
    assert plan["unpacked"] is True
    out, _ = call(monkeypatch, capsys, **args)
    assert out["changed"] is True, out
    assert hostparse.cudnn_header_version((tree / "include/cudnn_version.h").read_text()) == "8.6.0"
    assert not (tree / "lib64/libcudnn.so.7").exists()
    assert not list(tree.parent.glob(".old-*"))


def test_a_cudnn_copied_over_the_tree_s_files_needs_the_tarball_again(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args, tree = _placed(host, monkeypatch, capsys)
    # NVIDIA's `cp cuda/include/cudnn*.h /usr/local/cuda/include` writes through the hard link: the
    # unpacked copy's header is written over too.
    with (tree / "include/cudnn_version.h").open("wb") as f:
        f.write(header("8.9.7") + b"/* another release's header, another size */\n")
    plan, _ = call(monkeypatch, capsys, check=True, **args)
    assert plan["needed"] is True
    assert plan["unpacked"] is False
    assert plan["damage"][0].startswith("include/cudnn_version.h: ")
    assert "written over" in plan["damage"][0]
    # The toolkit's carry (cuda_toolkit's switch, before the cudnn role) has no copy to build from:
    # it leaves the tree as it is rather than switch to the toolkit alone.
    carry, _ = call(monkeypatch, capsys, link=host["link"], carry_cudnn=True, unpack_dir=args["unpack_dir"])
    assert (carry["changed"], Path(os.readlink(host["link"]))) == (False, tree)
    # Without the tarball the module says what it needs; with it, the copy and the tree are whole.
    failed, _ = call(monkeypatch, capsys, **args)
    assert failed["failed"] is True
    assert "no unpacked cuDNN 8.6.0.163" in failed["msg"]
    again = cudnn_args(host, "8.6.0.163", legacy=False)
    out, _ = call(monkeypatch, capsys, **again)
    assert out["changed"] is True, out
    assert hostparse.cudnn_header_version((tree / "include/cudnn_version.h").read_text()) == "8.6.0"
    assert call(monkeypatch, capsys, check=True, **args)[0]["needed"] is False


def test_check_mode_before_the_toolkit_s_link_exists_says_so_with_every_field_the_role_reads(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A whole run in check mode: the cuda_toolkit role has not made the link. need.yml reads each
    result's `unpacked` and `damage` (a missing one failed the run's plan)."""
    args = cudnn_args(host, "8.6.0.163", legacy=False)
    out, _ = call(monkeypatch, capsys, check=True, **{**args, "link": host["tmp"] / "usr/local/cuda-12.9"})
    assert (out["needed"], out["unpacked"], out["damage"]) == (True, False, [])
    assert "does not exist yet" in out["msg"]


# --- the loader's cache ------------------------------------------------------------------------
RACE = "ldconfig: Renaming of /etc/ld.so.cache~ to /etc/ld.so.cache failed: No such file or directory"


class Ldconfig:
    """run_command for ldconfig: the given results in turn, each call recorded."""

    def __init__(self, *results: tuple[int, str, str]) -> None:
        self.results = list(results)
        self.calls = 0

    def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        assert argv == ["ldconfig"]
        self.calls += 1
        return self.results.pop(0)


def test_ldconfig_that_lost_the_race_for_its_cache_file_runs_again() -> None:
    fake = Ldconfig((1, "", RACE), (1, "", RACE), (0, "", ""))
    tree_mod.run_ldconfig(fake, pause_s=0)  # type: ignore[arg-type]
    assert fake.calls == 3


def test_ldconfig_failing_otherwise_fails_at_once_with_its_message() -> None:
    fake = Ldconfig((1, "", "ldconfig: /etc/ld.so.conf.d/x.conf: Permission denied"))
    with pytest.raises(tree_mod.TreeError, match=r"ldconfig failed \(rc 1\): ldconfig: /etc/ld.so.conf.d/x.conf"):
        tree_mod.run_ldconfig(fake, pause_s=0)  # type: ignore[arg-type]
    assert fake.calls == 1


def test_ldconfig_losing_every_race_fails_saying_how_often_it_tried() -> None:
    fake = Ldconfig(*[(1, "", RACE)] * tree_mod.LDCONFIG_TRIES)
    with pytest.raises(tree_mod.TreeError, match=r"\(5 tries, another ldconfig ran beside each\): ldconfig: Renaming"):
        tree_mod.run_ldconfig(fake, pause_s=0)  # type: ignore[arg-type]
    assert fake.calls == tree_mod.LDCONFIG_TRIES
