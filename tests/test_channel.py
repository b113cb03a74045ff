"""The sandbox's conda channel: conda-forge's names and build strings from wheels' metadata, rattler-build
recipes cached by their hash, a py-rattler index. Unit tests build small channels from wheels made here
(seconds); the last three build the real one or find it cached (cold: about 3.5 GB downloaded, Python
compiled twice; see docs/sandbox.md, "The local conda channel") and install pytorch from it with py-rattler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rattler
import rattler.exceptions
import yaml
from rattler.package_streaming import extract

from testbed.sandbox import __main__ as cli
from testbed.sandbox import channel, mirror, pypi2conda, recipes
from testbed.sandbox.util import SandboxError

TORCH_251 = [  # torch 2.5.1's Requires-Dist, as its cp313 wheel on PyPI has them
    "filelock",
    "typing-extensions (>=4.8.0)",
    'nvidia-cudnn-cu12 (==9.1.0.70) ; platform_system == "Linux" and platform_machine == "x86_64"',
    'triton (==3.1.0) ; platform_system == "Linux" and platform_machine == "x86_64" and python_version < "3.13"',
    'sympy (==1.12.1) ; python_version == "3.8"',
    'setuptools ; python_version >= "3.12"',
    'sympy (==1.13.1) ; python_version >= "3.9"',
    "opt-einsum (>=3.3) ; extra == 'opt-einsum'",
]
NAMES = {"nvidia-cudnn-cu12": "cudnn", "typing-extensions": "typing_extensions", "torch": "pytorch"}


def _specs(requires: list[str], pythons: dict[str, str]) -> list[str]:
    return [s for s in (pypi2conda.requirement_spec(r, pythons, NAMES) for r in requires) if s]


def test_requirements_become_conda_forge_specs_for_the_target_python() -> None:
    want = ["filelock", "typing_extensions >=4.8.0", "cudnn ==9.1.0.70", "setuptools", "sympy ==1.13.1"]
    assert _specs(TORCH_251, {"3.13": "3.13.5"}) == want
    # For 3.11 torch 2.5.1 wants triton and not setuptools.
    want = ["filelock", "typing_extensions >=4.8.0", "cudnn ==9.1.0.70", "triton ==3.1.0", "sympy ==1.13.1"]
    assert _specs(TORCH_251, {"3.11": "3.11.2"}) == want
    want = ["mpmath <1.4,>=1.1.0", "markupsafe >=2.0"]
    assert _specs(["mpmath <1.4,>=1.1.0", "MarkupSafe>=2.0"], {"3.11": "3.11.2"}) == want


def test_a_noarch_package_cannot_depend_on_the_python_version() -> None:
    with pytest.raises(SandboxError, match="build it per Python"):
        pypi2conda.requirement_spec('setuptools ; python_version >= "3.12"', {"3.11": "3.11.2", "3.13": "3.13.5"}, {})
    with pytest.raises(SandboxError, match="URL"):
        pypi2conda.requirement_spec("foo @ https://example.org/foo.whl", {"3.11": "3.11.2"}, {})


def test_versions_and_python_ranges_as_conda_writes_them() -> None:
    assert pypi2conda.conda_version("2.13.0+cpu") == "2.13.0"
    assert pypi2conda.conda_version("2026.9.0") == "2026.9.0"
    with pytest.raises(SandboxError, match="PEP 440"):
        pypi2conda.conda_version("0.5.13-hg")
    assert pypi2conda.python_dep(None) == "python"
    assert pypi2conda.python_dep(">=3.8.0") == "python >=3.8.0"
    assert pypi2conda.python_dep("!=3.14.1,>=3.11") == "python !=3.14.1,>=3.11"
    assert pypi2conda.conda_name("Jinja2", {}) == "jinja2"
    assert pypi2conda.conda_name("typing_extensions", NAMES) == "typing_extensions"


def test_build_strings_follow_conda_forge() -> None:
    h = recipes.HASH
    assert recipes.build_string("python", python="3.13", variant="cuda124", blas="mkl") == f"cuda124_mkl_py313_h{h}_0"
    assert recipes.build_string("python", python="3.11", variant="cpu", blas="mkl") == f"cpu_mkl_py311_h{h}_0"
    assert recipes.build_string("python", python="3.13") == f"py313h{h}_0"
    assert recipes.build_string("noarch") == f"pyh{h}_0"
    assert recipes.build_string("cuda") == f"h{h}_0"
    assert recipes.cuda_variant("12.4") == "cuda124"
    with pytest.raises(SandboxError, match=r"MAJOR\.MINOR"):
        recipes.cuda_variant("12.4.1")


def _wheel(folder: Path, project: str, version: str, files: dict[str, bytes], meta: str = "", eps: str = "") -> Path:
    """A wheel as pip would find it: the given files, a dist-info with METADATA, a LICENSE, entry points."""
    dist = f"{project.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n{meta}")
        zf.writestr(f"{dist}.dist-info/LICENSE", "MIT License\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        if eps:
            zf.writestr(f"{dist}.dist-info/entry_points.txt", eps)
    return path


def _entry(path: Path, kind: str, **more: Any) -> dict[str, Any]:
    url = f"https://127.0.0.1:9/{path.name}"  # never reached: the file is in `local`
    return {
        "kind": kind,
        "file": path.name,
        "url": url,
        "sha256": mirror.digest(path),
        "local": [str(path.parent)],
        **more,
    }


def test_noarch_recipe_from_a_wheel(tmp_path: Path) -> None:
    meta = "Summary: A demo\nLicense-Expression: MIT\nRequires-Python: >=3.9\nRequires-Dist: typing-extensions>=4\n"
    eps = "[console_scripts]\ndemo = demo.cli:main\n[other]\nx = y:z\n"
    wheel = _wheel(tmp_path, "demo", "1.0", {"demo/__init__.py": b""}, meta, eps)
    info = pypi2conda.read_wheel(wheel)
    assert info.console_scripts == {"demo": "demo.cli:main"}
    with pytest.raises(SandboxError, match="not a plain name"):  # the names go into a shell script
        pypi2conda.entry_point("evil", "os; rm -rf /:main")
    r = recipes.wheel_recipe(_entry(wheel, "noarch"), info, {"3.11": "3.11.2", "3.13": "3.13.5"}, NAMES)
    doc = yaml.safe_load(r.text)
    assert (r.name, r.version, r.subdir) == ("demo", "1.0", "noarch")
    assert doc["build"]["noarch"] == "python"
    assert doc["build"]["python"]["entry_points"] == ["demo = demo.cli:main"]
    assert doc["requirements"]["run"] == ["python >=3.9", "typing_extensions >=4"]
    assert doc["source"] == [{"path": f"../../sources/{wheel.name}", "sha256": mirror.digest(wheel)}]
    assert doc["about"]["license"] == "MIT"
    assert doc["about"]["license_file"] == ["LICENSE"]
    # The build string carries the recipe's own hash; any change to the recipe changes both.
    assert r.build == f"pyh{r.key[:7]}_0"
    again = recipes.wheel_recipe(_entry(wheel, "noarch", depends=["extra"]), info, {"3.11": "3.11.2"}, NAMES)
    assert again.key != r.key
    assert again.build != r.build


def test_pytorch_recipe_names_the_build_as_conda_forge(tmp_path: Path) -> None:
    requires = "".join(f"Requires-Dist: {line}\n" for line in TORCH_251)
    wheel = _wheel(
        tmp_path,
        "torch",
        "2.5.1",
        {"torch/__init__.py": b""},
        requires,
        "[console_scripts]\ntorchrun = torch.distributed.run:main\n",
    )
    entry = _entry(wheel, "python", python="3.13", variant="cuda", cuda="12.4", blas="mkl", depends=["__cuda"])
    r = recipes.wheel_recipe(entry, pypi2conda.read_wheel(wheel), {"3.11": "3.11.2", "3.13": "3.13.5"}, NAMES)
    doc = yaml.safe_load(r.text)
    assert (r.ident, r.name, r.version, r.subdir) == ("pytorch-2.5.1-py313", "pytorch", "2.5.1", "linux-64")
    assert r.build.startswith("cuda124_mkl_py313_h")
    run = doc["requirements"]["run"]
    assert run[:2] == ["python >=3.13,<3.14.0a0", "python_abi 3.13.* *_cp313"]
    assert "cudnn ==9.1.0.70" in run
    assert run[-1] == "__cuda"
    script = "\n".join(doc["build"]["script"])
    assert '"$PREFIX/lib/python3.13/site-packages"' in script
    assert "from torch.distributed.run import main" in script
    assert '> "$PREFIX/bin/torchrun"' in script


def test_pytorch_channel_recipe_bundles_cudnn_and_renames_triton(tmp_path: Path) -> None:
    """PyTorch's channel's pytorch: its own build string, no nvidia-* dependency (pytorch-cuda and
    the mutex instead), triton as torchtriton, cuDNN's libraries inside, in a channel of its own."""
    requires = "".join(
        f"Requires-Dist: {line}\n" for line in [*TORCH_251, 'triton (==3.1.0) ; python_version < "3.13"']
    )
    wheel = _wheel(tmp_path, "torch", "2.5.1", {"torch/__init__.py": b""}, requires)
    cudnn = _nvidia(tmp_path / "cudnn", "nvidia-cudnn-cu12", "9.1.0.70", "libcudnn.so.9", b"\x7fELF")
    entry = _entry(
        wheel, "python", channel="pytorch", python="3.11", build="py3.11_cuda12.4_cudnn9.1.0_0",
        names={"triton": "torchtriton"}, drop_requires=["nvidia-*"], bundle=[_entry(cudnn, "cuda")],
        depends=["pytorch-cuda >=12.4,<12.5", "pytorch-mutex ==1.0 cuda"],
    )  # fmt: skip
    r = recipes.wheel_recipe(entry, pypi2conda.read_wheel(wheel), {"3.11": "3.11.2"}, NAMES)
    doc = yaml.safe_load(r.text)
    assert (r.ident, r.channel, r.build) == ("pytorch-2.5.1-py311@conda-pytorch", "conda-pytorch",
                                             "py3.11_cuda12.4_cudnn9.1.0_0")  # fmt: skip
    run = doc["requirements"]["run"]
    assert not [d for d in run if d.startswith(("cudnn", "nvidia", "triton "))]
    assert "torchtriton ==3.1.0" in run
    assert run[-2:] == ["pytorch-cuda >=12.4,<12.5", "pytorch-mutex ==1.0 cuda"]
    assert [s["path"] for s in doc["source"]] == [f"../../sources/{wheel.name}", f"../../sources/{cudnn.name}"]
    script = "\n".join(doc["build"]["script"])
    assert f"unzip -q -o {cudnn.name} 'nvidia/*' -d bundle" in script
    assert '-exec mv -t "$PREFIX/lib" {} +' in script
    with pytest.raises(SandboxError, match="channel 'defaults': one of conda-forge, pytorch"):
        recipes.wheel_recipe({**entry, "channel": "defaults"}, pypi2conda.read_wheel(wheel), {"3.11": "3.11.2"}, NAMES)


def _nvidia(folder: Path, project: str, version: str, lib: str, payload: bytes, requires: str = "") -> Path:
    sub = project.removeprefix("nvidia-").removesuffix("-cu12")
    files = {f"nvidia/{sub}/lib/{lib}": payload, f"nvidia/{sub}/include/{sub}.h": b"/* */\n"}
    return _wheel(folder, project, version, {"nvidia/__init__.py": b"", **files}, requires)


@pytest.fixture
def small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A channel of two CUDA-style libraries (one needs the other) and cuda-version; a real shared
    library inside, so that rattler-build's relinking runs."""
    monkeypatch.setenv("GPUENV_CACHE", str(tmp_path / "cache"))
    libz = Path("/lib/x86_64-linux-gnu/libz.so.1").read_bytes()  # zlib is essential on Debian
    foo = _nvidia(tmp_path / "wheels", "nvidia-foo-cu12", "12.4.1", "libfoo.so.12", libz)
    needs_foo = "Requires-Dist: nvidia-foo-cu12\n"
    bar = _nvidia(tmp_path / "wheels", "nvidia-bar-cu12", "1.0", "libbar.so.1", libz, needs_foo)
    cuda = ["cuda-version >=12.4,<12.5.0a0"]
    return {
        "os_packages": ["patchelf", "unzip"],  # rattler-build relinks with patchelf; the recipes unzip
        "cuda_versions": ["12.4"],
        "pypi_names": {"nvidia-foo-cu12": "libfoo", "nvidia-bar-cu12": "libbar"},
        "wheels": [_entry(foo, "cuda", depends=cuda), _entry(bar, "cuda", depends=cuda)],
        "_paths": (tmp_path / "channel", tmp_path / "work"),
    }


def _build(data: dict[str, Any]) -> dict[str, bool]:
    where, work = data["_paths"]
    return {o.recipe.filename(): o.built for o in channel.build(data, where, work)}


def test_small_channel_builds_indexes_caches_and_verifies(small: dict[str, Any]) -> None:
    where, work = small["_paths"]
    first = _build(small)
    assert len(first) == 3
    assert all(first.values())
    assert channel.verify(where) == []
    repodata = json.loads((where / "linux-64" / "repodata.json").read_text())["packages.conda"]
    bar = next(r for f, r in repodata.items() if f.startswith("libbar-1.0-h"))
    assert bar["depends"] == ["libfoo", "cuda-version >=12.4,<12.5.0a0"]
    noarch = json.loads((where / "noarch" / "repodata.json").read_text())["packages.conda"]
    (cv,) = noarch.values()
    assert (cv["name"], cv["version"], cv["constrains"]) == (
        "cuda-version",
        "12.4",
        ["__cuda >=12", "cudatoolkit 12.4.*"],
    )
    # Unchanged inputs: nothing is built again.
    assert not any(_build(small).values())
    # A changed pin rebuilds that package only, and the old file goes.
    new_bar = _nvidia(
        Path(small["wheels"][1]["local"][0]), "nvidia-bar-cu12", "1.1", "libbar.so.1", b"\x7fELF-not-really"
    )
    small["wheels"][1] = _entry(new_bar, "cuda", depends=small["wheels"][1]["depends"])
    third = _build(small)
    assert [f for f, built in third.items() if built] == [f for f in third if f.startswith("libbar-1.1-")]
    assert not list((where / "linux-64").glob("libbar-1.0-*"))
    # A package changed on disk: verify says so, and the next build puts it right.
    foo = next((where / "linux-64").glob("libfoo-*.conda"))
    data = bytearray(foo.read_bytes())
    data[len(data) // 2] ^= 0xFF
    foo.write_bytes(bytes(data))
    assert any("sha256 differs" in p for p in channel.verify(where))
    assert _build(small)[foo.name] is True
    assert channel.verify(where) == []
    # The CUDA library is where conda-forge puts it, with its development name beside it, and
    # relinked to find its neighbours in the prefix's lib/.
    unpacked = work / "unpacked"
    extract(str(next((where / "linux-64").glob("libfoo-*.conda"))), str(unpacked))
    assert (unpacked / "lib" / "libfoo.so").readlink() == Path("libfoo.so.12")
    assert (unpacked / "include" / "foo.h").exists()
    assert not (unpacked / "lib" / "__init__.py").exists()
    rpath = subprocess.run(
        ["/usr/bin/patchelf", "--print-rpath", str(unpacked / "lib" / "libfoo.so.12")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert rpath.stdout.strip() == "$ORIGIN/"


def test_a_second_channels_packages_go_beside_the_main_one(small: dict[str, Any]) -> None:
    """PyTorch's channel's metapackages (builds named cuda and cpu, no hash) in conda-pytorch/,
    indexed and verified on their own; the main channel keeps its packages."""
    where, _ = small["_paths"]
    small["metapackages"] = [
        {"channel": "pytorch", "name": "pytorch-mutex", "version": "1.0", "build": "cuda"},
        {"channel": "pytorch", "name": "pytorch-mutex", "version": "1.0", "build": "cpu"},
        {"channel": "pytorch", "name": "pytorch-cuda", "version": "12.4", "depends": ["libfoo >=12.4,<12.5"]},
    ]
    built = _build(small)
    assert {"pytorch-mutex-1.0-cuda.conda", "pytorch-mutex-1.0-cpu.conda"} <= set(built)
    second = where.parent / "conda-pytorch"
    noarch = json.loads((second / "noarch" / "repodata.json").read_text())["packages.conda"]
    assert sorted((r["name"], r["build"]) for r in noarch.values() if r["name"] == "pytorch-mutex") == [
        ("pytorch-mutex", "cpu"), ("pytorch-mutex", "cuda")]  # fmt: skip
    cuda = next(r for r in noarch.values() if r["name"] == "pytorch-cuda")
    assert cuda["depends"] == ["libfoo >=12.4,<12.5"]
    assert channel.verify(second) == []
    assert not list((where / "noarch").glob("pytorch-*"))
    # Dropped from the data: gone from its channel at the next build.
    small["metapackages"] = small["metapackages"][:1]
    _build(small)
    assert [p.name for p in (second / "noarch").glob("*.conda")] == ["pytorch-mutex-1.0-cuda.conda"]
    # The last of its packages dropped: its channel empties, and its index lists nothing.
    del small["metapackages"]
    _build(small)
    assert list((second / "noarch").glob("*.conda")) == []
    assert json.loads((second / "noarch" / "repodata.json").read_text())["packages.conda"] == {}
    assert channel.verify(second) == []


def test_a_dependency_the_channel_lacks_is_refused(small: dict[str, Any]) -> None:
    del small["wheels"][0]  # libbar still needs libfoo
    with pytest.raises(SandboxError, match="depends on 'libfoo', which no package of the channel provides"):
        _build(small)


def test_a_source_that_cannot_be_found_says_where_to_put_it(small: dict[str, Any], tmp_path: Path) -> None:
    entry = dict(small["wheels"][0], local=[], sha256="0" * 64)
    with pytest.raises(SandboxError, match=r"cannot be fetched .*put nvidia_foo_cu12-12.4.1-py3-none-any.whl"):
        channel.fetch(entry, tmp_path / "sources")


def test_verify_of_an_unbuilt_channel_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUENV_CACHE", str(tmp_path))
    assert cli.main(["channel", "verify"]) == 1
    assert "repodata.json: missing (run scripts/sandbox channel build)" in capsys.readouterr().out
    assert cli.main(["channel", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "mirror" / "site" / "conda")


def test_the_data_pins_every_source() -> None:
    data = channel.spec()
    assert all(e["source"]["from"] for e in data["pythons"].values())
    assert data["wheel_pins_from"]
    for source in [e["source"] for e in data["pythons"].values()] + data["wheels"]:
        assert len(source["sha256"]) == 64, source
        assert source["url"].startswith(("https://", "http://deb.debian.org/")), source


# --- The real channel: built (or found cached), served over HTTP, solved and installed with py-rattler.


@pytest.fixture(scope="session")
def real_channel() -> Path:
    channel.build()
    return channel.channel_dir()


@contextlib.contextmanager
def _served(root: Path) -> Iterator[str]:
    """The channel over HTTP from Python's http.server, as the sandbox mirror serves it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _solve(url: str, specs: list[Any], virtual: list[Any]) -> list[Any]:
    return asyncio.run(rattler.solve(sources=[url], specs=specs, virtual_packages=virtual))


def _install(records: list[Any], name: str) -> Path:
    """A fresh prefix beside the package cache (same disk: rattler hardlinks instead of copying)."""
    prefix = channel.work_dir() / "test-envs" / name
    shutil.rmtree(prefix, ignore_errors=True)
    asyncio.run(rattler.install(records, prefix, cache_dir=channel.work_dir() / "pkgs", show_progress=False))
    return prefix


def _run(prefix: Path, code: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_channel_installs_pytorch_cpu_on_python_311(real_channel: Path) -> None:
    with _served(real_channel) as url:
        # conda-forge's way of asking for the CPU build, as a conda user writes it.
        records = _solve(url, ["python 3.11.*", rattler.MatchSpec("pytorch=*=cpu*")], [])
        torch = next(r for r in records if r.name.normalized == "pytorch")
        assert str(torch.version) == "2.13.0"
        assert str(torch.build).startswith("cpu_mkl_py311_h")
        prefix = _install(records, "cpu311")
    try:
        got = _run(
            prefix,
            "import json, sys, torch; print(json.dumps({'torch': torch.__version__, 'file': torch.__file__, "
            "'python': sys.version.split()[0], 'mkl': torch.backends.mkl.is_available(), "
            "'sum': float((torch.ones(3) * 2).sum())}))",
        )
        assert got["torch"] == "2.13.0+cpu"
        assert got["file"].startswith(str(prefix / "lib" / "python3.11" / "site-packages"))
        assert got["python"] == "3.11.2"
        assert got["mkl"] is True  # the build string says mkl
        assert got["sum"] == 6.0
        (meta,) = (prefix / "conda-meta").glob("pytorch-*.json")
        record = json.loads(meta.read_text())
        assert (record["name"], record["version"], record["build"]) == ("pytorch", "2.13.0", str(torch.build))
        assert record["sha256"] == torch.sha256.hex()
        assert (prefix / "conda-meta" / "history").exists()
        assert (prefix / "bin" / "torchrun").read_text().startswith(f"#!{prefix}/bin/python3.11")
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def test_channel_installs_pytorch_cuda_with_its_cudnn_on_python_313(
    real_channel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine has no NVIDIA driver: __cuda comes from CONDA_OVERRIDE_CUDA, as on a host
    # provisioned before its driver loads.
    monkeypatch.setenv("CONDA_OVERRIDE_CUDA", "12.4")
    virtual = rattler.VirtualPackage.detect(rattler.VirtualPackageOverrides.from_env())
    records = _solve(real_channel.as_uri(), ["python 3.13.*", "pytorch ==2.5.1 cuda124*"], virtual)
    torch = next(r for r in records if r.name.normalized == "pytorch")
    assert str(torch.build).startswith("cuda124_mkl_py313_h")
    cudnn = next(r for r in records if r.name.normalized == "cudnn")
    assert str(cudnn.version) == "9.1.0.70"
    major, minor, patch = (int(x) for x in str(cudnn.version).split(".")[:3])
    assert {"cuda-version", "cuda-cudart", "libcublas", "libcusparse", "libnvjitlink", "nccl"} <= {
        r.name.normalized for r in records
    }
    prefix = _install(records, "cuda313")
    try:
        got = _run(
            prefix,
            "import json, torch; v = torch.backends.cudnn.version(); "
            "maps = open('/proc/self/maps').read().split(); "
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cudnn': v, "
            "'available': torch.cuda.is_available(), 'libcudnn': sorted({p for p in maps if '/libcudnn.so' in p})}))",
        )
        assert got["torch"] == "2.5.1+cu124"  # the wheel's own version string
        assert got["cuda"] == "12.4"
        assert got["cudnn"] == major * 10000 + minor * 100 + patch  # cuDNN 9's CUDNN_VERSION: 90100
        assert got["libcudnn"] == [str(prefix / "lib" / "libcudnn.so.9")]  # the channel's cudnn, from lib/
        assert got["available"] is False  # no driver here; the build is still the CUDA one
        (meta,) = (prefix / "conda-meta").glob("cudnn-*.json")
        assert json.loads(meta.read_text())["version"] == "9.1.0.70"
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def test_a_spec_the_channel_cannot_solve_fails_with_the_solvers_reason(real_channel: Path) -> None:
    with _served(real_channel) as url:
        # torch 2.5.1 is here for Python 3.13 only.
        with pytest.raises(rattler.exceptions.SolverError, match=r"pytorch ==2\.5\.1 cannot be installed"):
            _solve(url, ["python 3.11.*", "pytorch ==2.5.1"], [])
        # Its CUDA build needs a driver, or CONDA_OVERRIDE_CUDA.
        with pytest.raises(rattler.exceptions.SolverError, match="__cuda"):
            _solve(url, ["python 3.13.*", "pytorch ==2.5.1"], [])
