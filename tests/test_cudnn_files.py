"""The cuDNN tarball and the tree helpers behind gpuenv_cuda_tree (plugins/module_utils/
gpuenv_cudnn_files.py): both of NVIDIA's layouts recognised from real listings, hostile members refused,
a full disk or a killed run leaving nothing half-done, and pruning that keeps to the role's own trees."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.cudnn_tarballs import LIBS_8, call, cudnn_args, files, make_host, make_tarball, make_toolkit


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    return make_host(tmp_path)


# --- the layouts, from real listings -----------------------------------------------------------
def test_the_old_tgz_layout_is_recognised_from_a_real_listing() -> None:
    # tar -tzf cudnn-10.1-linux-x64-v7.6.5.32.tgz (docs/research/cudnn8-releases.md 2b)
    listing = ["cuda/include/cudnn.h", "cuda/NVIDIA_SLA_cuDNN_Support.txt", "cuda/lib64/libcudnn.so",
               "cuda/lib64/libcudnn.so.7", "cuda/lib64/libcudnn.so.7.6.5", "cuda/lib64/libcudnn_static.a"]  # fmt: skip
    assert files.detect_layout(listing) == {"layout": files.LEGACY, "top": "cuda", "include": "include", "lib": "lib64"}
    # tar -tzf of an 8.0.5 tgz: cudnn_version.h and the split libraries, with "./" as some tars write it
    listing_8 = ["./cuda/include/cudnn_version.h"] + [f"./cuda/lib64/{n}.so.8.0.5" for n in LIBS_8]
    assert files.detect_layout(listing_8)["lib"] == "lib64"


def test_the_redist_layout_is_recognised_from_a_real_listing() -> None:
    top = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive"
    listing = [f"{top}/LICENSE", f"{top}/include/cudnn.h", f"{top}/include/cudnn_version.h",
               f"{top}/include/cudnn_adv_infer_v8.h", f"{top}/lib/libcudnn.so", f"{top}/lib/libcudnn.so.8",
               f"{top}/lib/libcudnn.so.8.9.7", f"{top}/lib/libcudnn_cnn_infer_static_v8.a"]  # fmt: skip
    assert files.detect_layout(listing) == {"layout": files.REDIST, "top": top, "include": "include", "lib": "lib"}


@pytest.mark.parametrize(
    ("listing", "says"),
    [
        (["cuda/include/cudnn.h", "other/lib64/libcudnn.so"], "2 top folders"),
        (["cudnn/LICENSE", "cudnn/lib/libcudnn.so.9"], "neither cuDNN layout"),
        (["cudnn/bin/cudnn.dll", "cudnn/include/cudnn.h"], "holds bin, include"),
    ],
)
def test_other_layouts_are_refused_with_what_they_hold(listing: list[str], says: str) -> None:
    with pytest.raises(files.TreeError, match=says):
        files.detect_layout(listing)


@pytest.mark.parametrize(
    ("name", "kind", "link"),
    [
        ("cuda/../../etc/ld.so.conf.d/x.conf", "file", ""),
        ("/etc/passwd", "file", ""),
        ("cuda/lib64/libcudnn.so", "symlink", "../../../usr/lib/libc.so.6"),
        ("cuda/lib64/libcudnn.so", "symlink", "/etc/shadow"),
        ("cuda/lib64/libcudnn.so.8", "other", ""),
    ],
)
def test_members_that_could_write_outside_are_named(name: str, kind: str, link: str) -> None:
    assert files.member_problem(name, kind, link) is not None
    assert files.member_problem("cuda/lib64/libcudnn.so.8", "symlink", "libcudnn.so.8.2.1") is None


def test_a_tarball_with_a_hostile_member_is_refused_before_anything_lands(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = tarfile.TarInfo("cuda/lib64/libcudnn_evil.so")
    evil.type, evil.linkname = tarfile.SYMTYPE, "../../../../etc/ld.so.preload"
    archive = host["downloads"] / "evil.tgz"
    sha = make_tarball(archive, "8.2.1.32", legacy=True, extra=[evil])
    out, _ = call(monkeypatch, capsys, link=host["link"], cudnn_archive=archive, cudnn_sha256=sha,
                  cudnn_version="8.2.1.32", unpack_dir=host["downloads"] / "unpacked")  # fmt: skip
    assert out["failed"]
    assert "libcudnn_evil.so" in out["msg"]
    assert "outside its own directory" in out["msg"]
    assert os.readlink(host["link"]) == str(host["base"])
    assert not (host["downloads"] / "unpacked" / sha).exists()


def test_only_the_roles_own_toolkit_trees_are_pruned_by_version(tmp_path: Path) -> None:
    base = make_toolkit(tmp_path, "12.4.1-aaaaaaaaaaaa")
    old = make_toolkit(tmp_path, "12.4.1-bbbbbbbbbbbb")
    other = make_toolkit(tmp_path, "12.1.1-cccccccccccc")
    assert files.prune(str(base), {str(base)}, versions=True) == [str(old)]
    assert other.is_dir()
    user = make_toolkit(tmp_path, "cuda-11.3")
    make_toolkit(tmp_path, "cuda-12.0")
    assert files.prune(str(user), {str(user)}, versions=True) == []


def test_a_full_disk_during_the_unpack_leaves_no_partial_copy_and_the_tree_as_it_was(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=True)
    real_copy = shutil.copyfileobj
    copied = {"n": 0}

    def fills_up(src: Any, dst: Any, length: int = 0) -> None:
        copied["n"] += 1
        if copied["n"] == 4:
            raise OSError(28, "No space left on device")
        real_copy(src, dst, length)

    monkeypatch.setattr(shutil, "copyfileobj", fills_up)
    out, ran = call(monkeypatch, capsys, **args)
    assert out["failed"]
    assert "No space left on device" in out["msg"]
    # no .partial left behind; the lock file of one placement at a time stays
    assert [p.name for p in (host["downloads"] / "unpacked").iterdir()] == [".lock"]
    assert os.readlink(host["link"]) == str(host["base"])
    assert ran.commands == []


def test_what_a_killed_run_left_in_staging_is_removed(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=True)
    left = host["root"] / f".staging-{host['base'].name}+cudnn-8.6.0.163-{args['cudnn_sha256'][:12]}"
    (left / "lib").mkdir(parents=True)
    (left / "lib/libcudnn.so.8.6.0").write_text("half\n")  # SIGKILL: no cleanup ran
    (host["downloads"] / "unpacked" / f"{args['cudnn_sha256']}.partial").mkdir(parents=True)
    out, _ = call(monkeypatch, capsys, **args)
    assert out["changed"]
    assert not left.exists()
    assert not (host["downloads"] / "unpacked" / f"{args['cudnn_sha256']}.partial").exists()
    assert (Path(os.readlink(host["link"])) / "lib/libcudnn.so.8.6.0").read_text() == "libcudnn 8.6.0.163\n"


def test_the_tarball_is_read_once_to_unpack_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An xz tarball read at random (its member list, then each member) was decompressed twice: a
    seek back in an xz stream starts again from its top (20 s of cuDNN 9's 600 MB here). Its bytes
    are read twice now: once for the sha256, once to unpack."""
    archive = tmp_path / "cudnn.tar.xz"
    sha = make_tarball(archive, "9.1.0.70", legacy=False, blob=4 << 20)
    read = {"bytes": 0}

    class Counting(io.FileIO):
        def readinto(self, buffer: Any) -> int | None:
            n = super().readinto(buffer)
            read["bytes"] += n or 0
            return n

    real_open = open

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(file) == str(archive) and mode == "rb":
            return io.BufferedReader(Counting(str(file), "r"))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    monkeypatch.setattr(tarfile, "bltn_open", counting_open)
    info = files.unpack(str(archive), sha, "9.1.0.70", str(tmp_path / "unpacked"))
    monkeypatch.undo()
    assert "lib/libcudnn_blob.so.9.1.0" in info["files"]
    assert (tmp_path / "unpacked" / sha / "lib/libcudnn_blob.so.9.1.0").stat().st_size == 4 << 20
    assert read["bytes"] <= 2.2 * archive.stat().st_size, (read["bytes"], archive.stat().st_size)


def test_a_second_top_folder_is_refused_with_the_layout_s_message(host: dict[str, Path]) -> None:
    other = tarfile.TarInfo("another-top/include/cudnn.h")
    other.size = 1
    archive = host["downloads"] / "two-tops.tar.xz"
    sha = make_tarball(archive, "9.1.0.70", legacy=False, extra=[other])
    with pytest.raises(files.TreeError, match="2 top folders"):
        files.unpack(str(archive), sha, "9.1.0.70", str(host["downloads"] / "unpacked"))
    assert not (host["downloads"] / "unpacked" / f"{sha}.partial").exists()
