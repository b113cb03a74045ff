"""What the tests of gpuenv_cuda_tree (test_cuda_tree_module.py) and of its files
(plugins/module_utils/gpuenv_cudnn_files.py, test_cudnn_files.py) share: cuDNN tarballs and toolkit
trees made as NVIDIA and the cuda_toolkit role make them, and the module called as Ansible calls it.

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

from tests.conftest import load_plugin, module_utils

REPO = Path(__file__).resolve().parents[1]
mod = load_plugin("plugins/modules/gpuenv_cuda_tree.py")
# What the module imports as ansible.module_utils.gpuenv_cudnn_files (loaded by load_plugin).
files = module_utils("gpuenv_cudnn_files")

LIBS_8 = ["libcudnn", "libcudnn_ops_infer", "libcudnn_ops_train", "libcudnn_cnn_infer", "libcudnn_cnn_train",
          "libcudnn_adv_infer", "libcudnn_adv_train"]  # fmt: skip


def header(version: str) -> bytes:
    major, minor, patch = version.split(".")[:3]
    return (
        f"#ifndef CUDNN_VERSION_H_\n#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n"
        f"#define CUDNN_PATCHLEVEL {patch}\n#define CUDNN_VERSION (CUDNN_MAJOR * 1000 + CUDNN_MINOR * 100)\n"
    ).encode()


def make_tarball(
    path: Path, version: str, *, legacy: bool, extra: list[tarfile.TarInfo] | None = None, blob: int = 0
) -> str:
    """A cuDNN tarball in one of NVIDIA's two layouts; returns its sha256. blob: the size of one more
    library of random bytes, which no compression shrinks."""
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
    if blob:
        add(f"{top}/{lib}/libcudnn_blob.so.{xyz}", os.urandom(blob))
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


def make_host(tmp_path: Path) -> dict[str, Path]:
    """A host's CUDA tree as the cuda_toolkit role leaves it: /usr/local/cuda-11.8 -> a toolkit tree."""
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
