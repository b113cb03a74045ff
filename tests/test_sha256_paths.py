"""A sha256 names directories (unpack_dir/<sha256>, <base>+cudnn-<version>-<sha256[:12]>) and
records decide what root links and removes: every sha256 is 64 lowercase hex digits or refused,
every file a record names stays inside its tree, and a record is trusted only where nobody but root
can write. An unpinned manifest with "sha256": "../../../../../tmp/evil" once made the role trust a
record a local user planted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuenv import redist
from tests.cudnn_tarballs import call, cudnn_args, files, make_host

EVIL = "../../../../../tmp/evil"
GOOD = "a" * 64


@pytest.mark.parametrize("sha", [EVIL, "A" * 64, "a" * 63, "a" * 64 + "\n", "\uff41" * 64, 12, None])
def test_a_manifest_whose_sha256_is_not_64_hex_digits_is_refused(sha: object) -> None:
    manifest = {
        "release_label": "9.1.0",
        "cudnn": {
            "version": "9.1.0.70",
            "linux-x86_64": {"cuda12": {"relative_path": "cudnn/linux-x86_64/cudnn.tar.xz", "sha256": sha}},
        },
    }
    with pytest.raises(redist.RedistError, match="is not 64 lowercase hex digits"):
        redist.archives(manifest, ["cudnn"], variant="cuda12")


@pytest.mark.parametrize("sha", [EVIL, "A" * 64, "../" + "a" * 61])
def test_the_files_module_refuses_a_sha256_that_is_not_one(tmp_path: Path, sha: str) -> None:
    with pytest.raises(files.TreeError, match="is not a sha256"):
        files.unpacked_info(str(tmp_path), sha)
    with pytest.raises(files.TreeError, match="is not a sha256"):
        files.unpack(str(tmp_path / "x.tar.xz"), sha, "9.1.0.70", str(tmp_path))
    with pytest.raises(files.TreeError, match="is not a sha256"):
        files.composed_name(str(tmp_path / "cuda-12.4"), {"version": "9.1.0.70", "sha256": sha})


def _record(directory: Path, data: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / files.UNPACKED
    path.write_text(json.dumps(data))
    return path


def test_a_planted_record_in_a_directory_another_account_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chowns a directory to another account: needs root")
    unpack_dir = tmp_path / "cudnn"
    _record(unpack_dir / GOOD, {"sha256": GOOD, "version": "9.1.0.70", "files": ["lib/libcudnn.so.9"]})
    (unpack_dir / GOOD / "lib").mkdir()
    (unpack_dir / GOOD / "lib/libcudnn.so.9").write_bytes(b"\x7fELF")  # the record's file: a complete copy
    assert files.unpacked_info(str(unpack_dir), GOOD) is not None
    os.chown(unpack_dir / GOOD, 4242, 4242)
    with pytest.raises(files.TreeError, match="owned by uid 4242"):
        files.unpacked_info(str(unpack_dir), GOOD)


@pytest.mark.parametrize(("entry", "mode"), [("dir", 0o777), ("dir", 0o775), ("file", 0o666)])
def test_a_record_others_can_write_is_refused(tmp_path: Path, entry: str, mode: int) -> None:
    path = _record(tmp_path / GOOD, {"sha256": GOOD, "version": "9.1.0.70", "files": []})
    (path.parent if entry == "dir" else path).chmod(mode)
    with pytest.raises(files.TreeError, match="writable by others than its owner"):
        files.unpacked_info(str(tmp_path), GOOD)


@pytest.mark.parametrize(
    "listed", [["../../../etc/cron.d/evil"], ["/etc/passwd"], ["lib/../../x"], ["lib//x"], "lib/x"]
)
def test_a_record_whose_files_lead_out_of_its_tree_is_refused(tmp_path: Path, listed: object) -> None:
    _record(tmp_path / GOOD, {"sha256": GOOD, "version": "9.1.0.70", "files": listed})
    with pytest.raises(files.TreeError, match="not all plain relative paths"):
        files.unpacked_info(str(tmp_path), GOOD)


def test_a_record_whose_sha256_is_not_one_is_refused(tmp_path: Path) -> None:
    _record(tmp_path / GOOD, {"sha256": EVIL, "version": "9.1.0.70", "files": []})
    with pytest.raises(files.TreeError, match="is not a sha256"):
        files.unpacked_info(str(tmp_path), GOOD)


def test_place_files_never_writes_outside_the_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "lib64").mkdir(parents=True)
    (tmp_path / "unpacked/lib").mkdir(parents=True)
    for rel in ("include/../../escaped", "lib", "bin/x"):
        with pytest.raises(files.TreeError, match="not a file under include/ or lib/"):
            files.place_files(str(tmp_path / "unpacked"), {"files": [rel]}, str(tree))
    assert not (tmp_path / "escaped").exists()


def test_the_module_refuses_a_cudnn_sha256_that_is_not_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    h = make_host(tmp_path)
    args = cudnn_args(h, "8.9.7.29", legacy=False) | {"cudnn_sha256": EVIL}
    result, _ = call(monkeypatch, capsys, **args)
    assert result["failed"]
    assert "cudnn_sha256 '../../../../../tmp/evil' is not a sha256" in result["msg"]
    assert not (tmp_path / "tmp").exists()


def test_a_record_reached_through_a_linked_tree_is_read_but_a_linked_record_is_not(tmp_path: Path) -> None:
    tree = tmp_path / "cuda-12.4.1-abc"
    path = _record(tree, {"sha256": GOOD, "version": "9.1.0.70", "files": []})
    (tmp_path / "cuda-12.4").symlink_to(tree.name)
    assert files.read_json(str(tmp_path / "cuda-12.4" / files.UNPACKED)) is not None
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / files.UNPACKED).symlink_to(path)
    with pytest.raises(files.TreeError, match="is not a plain file"):
        files.read_json(str(tmp_path / "elsewhere" / files.UNPACKED))
