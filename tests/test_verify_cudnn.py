"""verify's cuDNN library checks: the libraries each cuDNN major ships, found in the CUDA tree and
through the loader's cache (a copy missing from the cache, or shadowing torch's own), on stand-in
trees and `ldconfig -p` output in its real format."""

from __future__ import annotations

from pathlib import Path

from gpuenv.verify import base, compute, cuda_tree

CUDNN8 = [
    "libcudnn.so.8",
    "libcudnn_ops_infer.so.8",
    "libcudnn_ops_train.so.8",
    "libcudnn_cnn_infer.so.8",
    "libcudnn_cnn_train.so.8",
    "libcudnn_adv_infer.so.8",
    "libcudnn_adv_train.so.8",
]


def _cudnn_tree(tmp_path: Path, names: list[str]) -> Path:
    """A CUDA tree whose lib64 holds real files with the versioned names and the .so.8 links, as
    NVIDIA's tarballs and the cudnn role place them."""
    lib = tmp_path / "cuda/lib64"
    lib.mkdir(parents=True)
    for name in names:
        (lib / f"{name}.9.7").write_bytes(b"\x7fELF")
        (lib / name).symlink_to(f"{name}.9.7")
    return tmp_path / "cuda"


def _ldconfig(lines: list[tuple[str, str]]) -> str:
    """`ldconfig -p` output (its real format: a count line, then one tab-indented line per entry)."""
    body = "".join(f"\t{name} (libc6,x86-64) => {path}\n" for name, path in lines)
    return f"{len(lines)} libs found in cache `/etc/ld.so.cache'\n{body}"


def test_the_cudnn_8_tree_loads_through_the_loader_cache(tmp_path: Path) -> None:
    tree = _cudnn_tree(tmp_path, CUDNN8)
    cache = _ldconfig(
        [(n, str(tree / "lib64" / n)) for n in CUDNN8] + [("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6")]
    )
    ctx = base.Context(expect={"cudnn": "8.9.7.29", "cudnn_libraries": CUDNN8}, cuda_home=tree, ldconfig_cache=cache)
    check = cuda_tree.cudnn_loader(ctx)
    assert check.status == "pass", check
    assert check.summary == f"the loader finds all 7 cuDNN libraries in {tree / 'lib64'} (in the CUDA tree)"


def test_a_cudnn_library_missing_from_the_cache_or_shadowed_fails_with_the_ldconfig_hint(tmp_path: Path) -> None:
    tree = _cudnn_tree(tmp_path, CUDNN8)
    lines = [(n, str(tree / "lib64" / n)) for n in CUDNN8 if n != "libcudnn_cnn_infer.so.8"]
    shadow = "/usr/lib/x86_64-linux-gnu/libcudnn.so.8"
    lines = [(n, shadow if n == "libcudnn.so.8" else p) for n, p in lines]
    ctx = base.Context(
        expect={"cudnn": "8.2.1.32", "cudnn_libraries": CUDNN8}, cuda_home=tree, ldconfig_cache=_ldconfig(lines)
    )
    check = cuda_tree.cudnn_loader(ctx)
    assert check.status == "fail"
    assert check.observed == [
        f"libcudnn.so.8: the loader finds {shadow}, not {tree / 'lib64/libcudnn.so.8'}",
        "libcudnn_cnn_infer.so.8: not in the loader's cache",
    ]
    assert "run ldconfig: gpuenv writes /etc/ld.so.conf.d/gpuenv-cuda.conf" in (check.hint or "")


def test_a_library_the_release_ships_but_the_tree_lacks_fails(tmp_path: Path) -> None:
    tree = _cudnn_tree(tmp_path, CUDNN8[:1])
    cache = _ldconfig([("libcudnn.so.8", str(tree / "lib64/libcudnn.so.8"))])
    ctx = base.Context(expect={"cudnn": "8.9.7.29", "cudnn_libraries": CUDNN8}, cuda_home=tree, ldconfig_cache=cache)
    check = cuda_tree.cudnn_loader(ctx)
    assert check.status == "fail"
    assert f"libcudnn_cnn_infer.so.8: not in {tree / 'lib64'}" in check.observed


def test_no_system_cudnn_skips_the_loader_check() -> None:
    check = cuda_tree.cudnn_loader(base.Context(expect={"cudnn": "none"}))
    assert check.status == "skip"


def test_the_resolved_stack_names_the_libraries_of_each_cudnn_major() -> None:
    from gpuenv import compat, rules, stack  # noqa: PLC0415 - the controller's side of the contract

    data = compat.load()
    for declared, cuda, first in (
        ("8.2.1", "11.3.1", "libcudnn_ops_infer.so.8"),
        ("9.1.0", "12.4.1", "libcudnn_graph.so.9"),
    ):
        keys = {"profile": "torch-2.5-cu124", "cudnn": declared, "cuda": cuda, "driver": "550"}
        resolved = rules.check(stack.parse_stack(keys, data), data).resolved
        assert first in resolved["cudnn_libraries"]


def test_the_grad_scaler_of_older_torch_releases_is_used_where_torch_amp_has_none() -> None:
    """torch.amp.GradScaler("cuda") only exists from torch 2.3: on a 1.12-2.2 stack the autocast
    check must take torch.cuda.amp.GradScaler, or it fails on the first real GPU."""
    from types import SimpleNamespace  # noqa: PLC0415

    made: list[tuple[str, object]] = []
    new = SimpleNamespace(amp=SimpleNamespace(GradScaler=lambda device: made.append(("amp", device))))
    old = SimpleNamespace(
        amp=SimpleNamespace(),  # torch 2.0's torch.amp has autocast but no GradScaler
        cuda=SimpleNamespace(amp=SimpleNamespace(GradScaler=lambda enabled: made.append(("cuda.amp", enabled)))),
    )
    compute.grad_scaler(new, "cuda")
    compute.grad_scaler(old, "cuda")
    compute.grad_scaler(old, "cpu")  # no CPU scaler before 2.3: a disabled one, which passes steps through
    assert made == [("amp", "cuda"), ("cuda.amp", True), ("cuda.amp", False)]


def test_a_tree_without_cudnn_libraries_fails_the_loader_check(tmp_path: Path) -> None:
    (tmp_path / "cuda/lib64").mkdir(parents=True)
    check = cuda_tree.cudnn_loader(
        base.Context(expect={"cudnn": "9.1.0.70"}, cuda_home=tmp_path / "cuda", ldconfig_cache="")
    )
    assert check.status == "fail"
    assert check.summary == f"no cuDNN 9 libraries in {tmp_path / 'cuda/lib64'}"


def test_a_cudnn_library_only_root_can_read_fails_for_the_members_who_load_it(tmp_path: Path) -> None:
    tree = _cudnn_tree(tmp_path, CUDNN8)
    ctx = base.Context(expect={"cudnn": "8.9.7.29"}, cuda_home=tree)
    assert cuda_tree.cudnn_readable(ctx).status == "pass"
    closed = tree / "lib64/libcudnn_cnn_infer.so.8.9.7"
    closed.chmod(0o600)
    check = cuda_tree.cudnn_readable(ctx)
    assert check.status == "fail", check
    assert check.observed == [f"{closed} (mode 0600)"]
    assert "run playbooks/site.yml again" in (check.hint or "")
    assert cuda_tree.cudnn_readable(base.Context(expect={"cudnn": "none"})).status == "skip"


def _packages_host(tmp_path: Path, version: str = "9.1.0") -> base.Context:
    """A host whose cuDNN 9 came from NVIDIA's packages (the cudnn role's record says nvidia_repo):
    libraries in the system library directory, headers named cudnn*_v9.h beside them."""
    major, minor, patch = version.split(".")
    facts, include, lib = (
        tmp_path / "facts.d",
        tmp_path / "usr/include/x86_64-linux-gnu",
        tmp_path / "usr/lib/x86_64-linux-gnu",
    )
    for folder in (facts, include, lib):
        folder.mkdir(parents=True)
    (facts / "cudnn.fact").write_text('{"source": "nvidia_repo", "version": "9.1.0.70", "cuda_major": "12"}')
    (include / "cudnn_version_v9.h").write_text(
        f"#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL {patch}\n"
    )
    (lib / "libcudnn.so.9.1.0").write_bytes(b"\x7fELF")
    (lib / "libcudnn.so.9").symlink_to("libcudnn.so.9.1.0")
    return base.Context(
        expect={"cudnn": "9.1.0.70", "cudnn_libraries": ["libcudnn.so.9"]},
        cuda_home=tmp_path / "cuda",
        facts_dir=facts,
        system_include=include,
        system_lib=lib,
        ldconfig_cache=_ldconfig([("libcudnn.so.9", str(lib / "libcudnn.so.9"))]),
    )


def test_a_cudnn_from_nvidia_s_packages_is_read_from_the_system_directories(tmp_path: Path) -> None:
    ctx = _packages_host(tmp_path)
    header = cuda_tree.cudnn(ctx)
    assert header.status == "pass", header
    assert header.summary == f"{ctx.system_include / 'cudnn_version_v9.h'} says cuDNN 9.1.0 (installed by packages)"
    loader = cuda_tree.cudnn_loader(ctx)
    assert loader.status == "pass", loader
    assert loader.summary == f"the loader finds all 1 cuDNN libraries in {ctx.system_lib} (installed by packages)"
    assert cuda_tree.cudnn_readable(ctx).status == "pass"


def test_a_tarball_copy_in_a_cuda_tree_shadowing_the_packages_fails_and_names_it(tmp_path: Path) -> None:
    ctx = _packages_host(tmp_path)
    tree = _cudnn_tree(tmp_path, ["libcudnn.so.9"])
    ctx.ldconfig_cache = _ldconfig(
        [("libcudnn.so.9", str(tree / "lib64/libcudnn.so.9")), ("libcudnn.so.9", str(ctx.system_lib / "libcudnn.so.9"))]
    )
    check = cuda_tree.cudnn_loader(ctx)
    assert check.status == "fail"
    assert check.observed == [
        f"libcudnn.so.9: the loader finds {tree / 'lib64/libcudnn.so.9'}, not {ctx.system_lib / 'libcudnn.so.9'}"
    ]
    assert "gpuenv doctor names the copy that shadows it" in (check.hint or "")


def test_without_the_packages_header_the_check_names_the_file_nvidia_s_package_installs(tmp_path: Path) -> None:
    ctx = _packages_host(tmp_path)
    (ctx.system_include / "cudnn_version_v9.h").unlink()
    check = cuda_tree.cudnn(ctx)
    assert check.status == "fail"
    assert check.summary == f"no {ctx.system_include / 'cudnn_version_v9.h'}"
