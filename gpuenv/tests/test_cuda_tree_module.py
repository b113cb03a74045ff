"""The gpuenv_cuda_tree module (plugins/modules): a CUDA tree's cuDNN changes by switching the
tree's link to a complete new tree, from either tarball layout, and every way back is kept.

The tarballs here are small but laid out exactly as NVIDIA's: the member lists follow the real
listings in docs/research/cudnn8-releases.md section 2b (7.6.5 and 8.0.5 .tgz, 8.9.7 .tar.xz)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from gpuenv import hostparse
from gpuenv.tests.conftest import load_plugin

REPO = Path(__file__).resolve().parents[2]
mod = load_plugin("plugins/modules/gpuenv_cuda_tree.py")

LIBS_8 = ["libcudnn", "libcudnn_ops_infer", "libcudnn_ops_train", "libcudnn_cnn_infer", "libcudnn_cnn_train",
          "libcudnn_adv_infer", "libcudnn_adv_train"]  # fmt: skip


def header(version: str) -> bytes:
    major, minor, patch = version.split(".")[:3]
    return (
        f"#ifndef CUDNN_VERSION_H_\n#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n"
        f"#define CUDNN_PATCHLEVEL {patch}\n#define CUDNN_VERSION (CUDNN_MAJOR * 1000 + CUDNN_MINOR * 100)\n"
    ).encode()


def make_tarball(path: Path, version: str, *, legacy: bool, extra: list[tarfile.TarInfo] | None = None) -> str:
    """A cuDNN tarball in one of NVIDIA's two layouts; returns its sha256."""
    xyz = ".".join(version.split(".")[:3])
    major = version.split(".", maxsplit=1)[0]
    top, lib = ("cuda", "lib64") if legacy else (f"cudnn-linux-x86_64-{version}_cuda11-archive", "lib")
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []

    def add(name: str, data: bytes | None = None, link: str = "", kind: bytes = tarfile.REGTYPE) -> None:
        info = tarfile.TarInfo(name)
        if kind == tarfile.DIRTYPE:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
        elif link:
            info.type, info.linkname = tarfile.SYMTYPE, link
        else:
            # NVIDIA's 8.x tarballs hold their files 0644 or tighter; the role makes them a+r.
            info.size, info.mode = len(data or b""), 0o640
        members.append((info, data))

    add(top, kind=tarfile.DIRTYPE)
    add(f"{top}/include", kind=tarfile.DIRTYPE)
    add(f"{top}/include/cudnn.h", b"#include <cudnn_version.h>\n")
    add(f"{top}/include/cudnn_version.h", header(version))
    add(f"{top}/{lib}", kind=tarfile.DIRTYPE)
    for name in LIBS_8:
        add(f"{top}/{lib}/{name}.so.{xyz}", f"{name} {version}\n".encode())
        add(f"{top}/{lib}/{name}.so.{major}", link=f"{name}.so.{xyz}")
        add(f"{top}/{lib}/{name}.so", link=f"{name}.so.{major}")
    add(f"{top}/{'NVIDIA_SLA_cuDNN_Support.txt' if legacy else 'LICENSE'}", b"license\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if legacy else "w:xz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        for info in extra or []:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def make_toolkit(root: Path, name: str = "11.8.0-0123456789ab") -> Path:
    """A toolkit tree as the cuda_toolkit role builds it: lib64 -> lib, a marker."""
    tree = root / name
    (tree / "bin").mkdir(parents=True)
    (tree / "bin/ptxas").write_text("ptxas\n")
    (tree / "include").mkdir()
    (tree / "include/cuda_runtime.h").write_text("cuda\n")
    (tree / "lib").mkdir()
    (tree / "lib/libcudart.so.11.8.89").write_text("cudart\n")
    (tree / "lib/libcudart.so.11.0").symlink_to("libcudart.so.11.8.89")
    (tree / "lib64").symlink_to("lib")
    (tree / ".gpuenv-tree.json").write_text('{"cuda": "11.8.0"}\n')
    return tree


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "opt/gpuenv/cuda"
    base = make_toolkit(root)
    link = tmp_path / "usr/local/cuda-11.8"
    link.parent.mkdir(parents=True)
    link.symlink_to(base)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    return {"root": root, "base": base, "link": link, "downloads": downloads, "tmp": tmp_path}


class Ran:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        self.commands.append(argv)
        return 0, "", ""


def call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *, check: bool = False, **args: Any
) -> tuple[dict[str, Any], Ran]:
    ran = Ran()
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: ran(argv, **kw))
    if check:
        args["_ansible_check_mode"] = True
    with (
        patch_module_args({k: str(v) if isinstance(v, Path) else v for k, v in args.items()}),
        pytest.raises(SystemExit),
    ):
        mod.main()
    return json.loads(capsys.readouterr().out), ran


def cudnn_args(h: dict[str, Path], version: str, *, legacy: bool, name: str | None = None) -> dict[str, Any]:
    archive = h["downloads"] / (name or (f"cudnn-{version}.tgz" if legacy else f"cudnn-{version}.tar.xz"))
    sha = make_tarball(archive, version, legacy=legacy)
    return {
        "link": h["link"],
        "cudnn_archive": archive,
        "cudnn_sha256": sha,
        "cudnn_version": version,
        "unpack_dir": h["downloads"] / "unpacked",
    }


# --- the layouts, from real listings -----------------------------------------------------------
def test_the_old_tgz_layout_is_recognised_from_a_real_listing() -> None:
    # tar -tzf cudnn-10.1-linux-x64-v7.6.5.32.tgz (docs/research/cudnn8-releases.md 2b)
    listing = ["cuda/include/cudnn.h", "cuda/NVIDIA_SLA_cuDNN_Support.txt", "cuda/lib64/libcudnn.so",
               "cuda/lib64/libcudnn.so.7", "cuda/lib64/libcudnn.so.7.6.5", "cuda/lib64/libcudnn_static.a"]  # fmt: skip
    assert mod.detect_layout(listing) == {"layout": mod.LEGACY, "top": "cuda", "include": "include", "lib": "lib64"}
    # tar -tzf of an 8.0.5 tgz: cudnn_version.h and the split libraries, with "./" as some tars write it
    listing_8 = ["./cuda/include/cudnn_version.h"] + [f"./cuda/lib64/{n}.so.8.0.5" for n in LIBS_8]
    assert mod.detect_layout(listing_8)["lib"] == "lib64"


def test_the_redist_layout_is_recognised_from_a_real_listing() -> None:
    top = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive"
    listing = [f"{top}/LICENSE", f"{top}/include/cudnn.h", f"{top}/include/cudnn_version.h",
               f"{top}/include/cudnn_adv_infer_v8.h", f"{top}/lib/libcudnn.so", f"{top}/lib/libcudnn.so.8",
               f"{top}/lib/libcudnn.so.8.9.7", f"{top}/lib/libcudnn_cnn_infer_static_v8.a"]  # fmt: skip
    assert mod.detect_layout(listing) == {"layout": mod.REDIST, "top": top, "include": "include", "lib": "lib"}


@pytest.mark.parametrize(
    ("listing", "says"),
    [
        (["cuda/include/cudnn.h", "other/lib64/libcudnn.so"], "2 top folders"),
        (["cudnn/LICENSE", "cudnn/lib/libcudnn.so.9"], "neither cuDNN layout"),
        (["cudnn/bin/cudnn.dll", "cudnn/include/cudnn.h"], "holds bin, include"),
    ],
)
def test_other_layouts_are_refused_with_what_they_hold(listing: list[str], says: str) -> None:
    with pytest.raises(mod.TreeError, match=says):
        mod.detect_layout(listing)


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
    assert mod.member_problem(name, kind, link) is not None
    assert mod.member_problem("cuda/lib64/libcudnn.so.8", "symlink", "libcudnn.so.8.2.1") is None


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
    assert out["cudnn"]["layout"] == (mod.LEGACY if legacy else mod.REDIST)
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

    monkeypatch.setattr(mod.os, "replace", killed)
    out, _ = call(monkeypatch, capsys, **second)
    assert out["failed"]
    monkeypatch.setattr(mod.os, "replace", real_replace)
    assert os.readlink(host["link"]) == active
    assert hostparse.cudnn_header_version(Path(active, "include/cudnn_version.h").read_text()) == "8.6.0"
    assert len(list(Path(active).glob("lib/libcudnn*"))) == 3 * len(LIBS_8)
    out, _ = call(monkeypatch, capsys, **{**second, "cudnn_archive": second["cudnn_archive"]})
    assert out["changed"]
    assert "8.9.7.29" in os.readlink(host["link"])
    assert not list(host["root"].glob(".staging-*"))


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


def test_only_the_roles_own_toolkit_trees_are_pruned_by_version(tmp_path: Path) -> None:
    base = make_toolkit(tmp_path, "12.4.1-aaaaaaaaaaaa")
    old = make_toolkit(tmp_path, "12.4.1-bbbbbbbbbbbb")
    other = make_toolkit(tmp_path, "12.1.1-cccccccccccc")
    assert mod.prune(str(base), {str(base)}, versions=True) == [str(old)]
    assert other.is_dir()
    user = make_toolkit(tmp_path, "cuda-11.3")
    make_toolkit(tmp_path, "cuda-12.0")
    assert mod.prune(str(user), {str(user)}, versions=True) == []


def test_a_full_disk_during_the_unpack_leaves_no_partial_copy_and_the_tree_as_it_was(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cudnn_args(host, "8.6.0.163", legacy=True)
    real_copy = mod.shutil.copyfileobj
    copied = {"n": 0}

    def fills_up(src: Any, dst: Any, length: int = 0) -> None:
        copied["n"] += 1
        if copied["n"] == 4:
            raise OSError(28, "No space left on device")
        real_copy(src, dst, length)

    monkeypatch.setattr(mod.shutil, "copyfileobj", fills_up)
    out, ran = call(monkeypatch, capsys, **args)
    assert out["failed"]
    assert "No space left on device" in out["msg"]
    assert list((host["downloads"] / "unpacked").iterdir()) == []  # no .partial left behind
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
