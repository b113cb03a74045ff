"""rattler-build recipes for the sandbox's conda channel, named and versioned as conda-forge does.

Pure: from an entry of testbed/data/channel.yaml (and, for a wheel, the wheel's own metadata) to the
text of a recipe.yaml. channel.py fetches the sources, builds, caches and indexes.

Every build string carries `h<hash>`, the first 7 hex digits of the sha256 of the recipe itself
(rendered with a placeholder where the hash goes): any change to a recipe changes its package's
file name, so no client ever meets two different files under one name, and the full sha256 is the
key the channel caches the built package under.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import yaml
from packaging.requirements import Requirement

from testbed.sandbox.pypi2conda import (
    WheelInfo,
    conda_name,
    conda_version,
    entry_point,
    normalize,
    python_dep,
    requirement_spec,
)
from testbed.sandbox.util import SandboxError

HASH = "@HASH@"
# The channels: the main one stands in for conda-forge (and for NVIDIA's and the default channel
# that PyTorch's commands name beside it); "pytorch" is laid out as PyTorch's own channel was.
MAIN = "conda"
CHANNEL_FOLDERS = {"conda-forge": MAIN, "pytorch": "conda-pytorch"}
# Where recipes find their sources: recipes/<ident>/recipe.yaml beside sources/ in the work folder.
# Relative, so that the recipe text (and its hash) does not depend on where the cache lives.
SOURCES = "../../sources"


@dataclass(frozen=True)
class Recipe:
    ident: str  # one per package the channel holds: its recipe folder and its entry in the build state
    name: str
    version: str
    build: str
    subdir: str  # linux-64 or noarch
    text: str
    key: str  # sha256 of the recipe: the cache key of the built package
    channel: str = MAIN  # the channel's folder under the mirror's site (conda, conda-pytorch)

    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def build_string(
    kind: str, number: int = 0, python: str | None = None, variant: str | None = None, blas: str | None = None
) -> str:
    """conda-forge's build strings: pyh<hash>_0 (noarch python), py313h<hash>_0 (per Python),
    cuda124_mkl_py313_h<hash>_0 and cpu_mkl_py311_h<hash>_0 (pytorch), h<hash>_0 (the rest)."""
    py = f"py{python.replace('.', '')}" if python else ""
    if kind == "noarch":
        return f"pyh{HASH}_{number}"
    if kind == "python":
        if not python:
            raise SandboxError("a package built per Python needs `python:` in channel.yaml")
        if variant:
            return "_".join([variant, *([blas] if blas else []), py, f"h{HASH}", str(number)])
        return f"{py}h{HASH}_{number}"
    return f"h{HASH}_{number}"


def cuda_variant(cuda: str) -> str:
    """12.4 -> cuda124, as conda-forge's pytorch build strings name a CUDA build."""
    if not re.fullmatch(r"[0-9]+\.[0-9]+", cuda):
        raise SandboxError(f"cuda: {cuda!r} must be MAJOR.MINOR (12.4)")
    return "cuda" + cuda.replace(".", "")


def finalize(ident: str, name: str, version: str, subdir: str, template: str, *, channel: str = MAIN) -> Recipe:
    """The recipe with its own hash put in place of the placeholder. A package of a channel other
    than the main one has that channel in its ident (one build state for all channels)."""
    key = hashlib.sha256(template.encode()).hexdigest()
    text = template.replace(HASH, key[:7])
    build = yaml.safe_load(text)["build"]["string"]
    ident = ident if channel == MAIN else f"{ident}@{channel}"
    return Recipe(ident=ident, name=name, version=version, build=build, subdir=subdir, text=text, key=key,
                  channel=channel)  # fmt: skip


def channel_folder(entry: dict[str, Any]) -> str:
    """The folder of the channel an entry of channel.yaml goes to (`channel:`, conda-forge by default)."""
    name = str(entry.get("channel", "conda-forge"))
    if name not in CHANNEL_FOLDERS:
        raise SandboxError(f"channel {name!r}: one of {', '.join(CHANNEL_FOLDERS)}")
    return CHANNEL_FOLDERS[name]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(recipe: dict[str, Any]) -> str:
    return yaml.dump(recipe, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)


def _source(entry: dict[str, Any]) -> dict[str, str]:
    return {"path": f"{SOURCES}/{entry['file']}", "sha256": entry["sha256"]}


def cpython_recipe(minor: str, entry: dict[str, Any]) -> Recipe:
    """CPython from its release tarball, linked against the builder's (Debian's) system libraries."""
    version = entry["version"]
    if not version.startswith(minor + "."):
        raise SandboxError(f"pythons: {minor}: version {version} is not a {minor}.x release")
    abi = "cp" + minor.replace(".", "")
    recipe = {
        "package": {"name": "python", "version": version},
        "source": [_source(entry["source"])],
        "build": {
            "number": 0,
            "string": f"h{HASH}_0_cpython",
            "script": [
                # tkinter is left out: its Tk libraries are not on the sandbox's hosts. Nor the test
                # suite or a static libpython: neither is needed to run Python, and both cost time.
                './configure --prefix="$PREFIX" --enable-shared --without-static-libpython --with-ensurepip=no '
                '--disable-test-modules py_cv_module__tkinter=n/a LDFLAGS="-Wl,-rpath,$PREFIX/lib"',
                'make -j"$CPU_COUNT"',
                "make install",
                # conda-forge's python has bin/python; CPython installs python3 and python3.X only.
                f'ln -s python{minor} "$PREFIX/bin/python"',
            ],
        },
        "requirements": {"run": [f"python_abi {minor}.* *_{abi}"]},
        "about": {
            "homepage": "https://www.python.org",
            "license": "Python-2.0",
            "license_file": "LICENSE",
            "summary": f"CPython {version}, from its release tarball as Debian's archive carries it",
        },
    }
    return finalize(f"python-{version}", "python", version, "linux-64", dump(recipe))


def metapackage_recipe(
    name: str,
    version: str,
    build: str,
    summary: str,
    *,
    depends: list[str],
    constrains: list[str],
    channel: str = MAIN,
) -> Recipe:
    """A package of no files, only dependencies or constraints (cuda-version, python_abi,
    pytorch-mutex, pytorch-cuda)."""
    requirements: dict[str, list[str]] = {}
    if depends:
        requirements["run"] = depends
    if constrains:
        requirements["run_constraints"] = constrains
    recipe = {
        "package": {"name": name, "version": version},
        "build": {"number": 0, "string": build, "noarch": "generic"},
        "requirements": requirements,
        "about": {"summary": summary},
    }
    ident = f"{name}-{version}" if HASH in build else f"{name}-{version}-{build}"
    return finalize(ident, name, version, "noarch", dump(recipe), channel=channel)


def listed_metapackage_recipe(entry: dict[str, Any]) -> Recipe:
    """A metapackage channel.yaml lists (`metapackages`): PyTorch's channel's pytorch-mutex (its
    builds are named cuda and cpu, with no hash) and pytorch-cuda."""
    return metapackage_recipe(
        str(entry["name"]),
        str(entry["version"]),
        str(entry.get("build", f"h{HASH}_0")),
        str(entry.get("summary", entry["name"])),
        depends=[str(d) for d in entry.get("depends", [])],
        constrains=[str(c) for c in entry.get("constrains", [])],
        channel=channel_folder(entry),
    )


def cuda_version_recipe(cuda: str) -> Recipe:
    """conda-forge's cuda-version: selects the CUDA release that CUDA packages are built for."""
    major = cuda.split(".", maxsplit=1)[0]
    return metapackage_recipe(
        "cuda-version",
        cuda,
        f"h{HASH}_0",
        f"A meta-package to select CUDA {cuda}",
        depends=[],
        # conda-forge's cuda-version constrains the driver (__cuda) and the old cudatoolkit package.
        constrains=[f"__cuda >={major}", f"cudatoolkit {cuda}.*"],
    )


def python_abi_recipe(minor: str) -> Recipe:
    abi = "cp" + minor.replace(".", "")
    return metapackage_recipe(
        "python_abi",
        minor,
        f"h{HASH}_0_{abi}",
        f"Metadata for the {abi} ABI",
        depends=[],
        constrains=[f"python {minor}.* *_cpython"],
    )


def wheel_recipe(entry: dict[str, Any], info: WheelInfo, pythons: dict[str, str], names: dict[str, str]) -> Recipe:
    """A wheel repackaged: `kind` noarch (pure Python, noarch: python), python (built for one Python,
    into lib/pythonX.Y/site-packages), or cuda (an nvidia-* wheel's libraries and headers into
    lib/ and include/, where conda-forge's CUDA packages put them)."""
    kind, wheel = entry["kind"], entry["file"]
    names = {**names, **{normalize(k): v for k, v in entry.get("names", {}).items()}}
    info = _without(info, [str(d) for d in entry.get("drop_requires", [])])
    name, version = conda_name(info.project, names), conda_version(info.version)
    if set(info.data_dirs) - {"data", "purelib", "platlib"}:
        raise SandboxError(f"{wheel}: its .data holds {info.data_dirs}; only data, purelib and platlib are placed")
    # The license files, copied out of the wheel to the top of the work folder: rattler-build puts
    # them under info/licenses/ by the path given here.
    licenses = {f: f.split("/", 1)[1].replace("/", "_") for f in info.license_files}
    script = ["unzip -q -o " + wheel + " -d whl"]
    script += [f'cp "whl/{src}" "{dest}"' for src, dest in licenses.items()]
    build: dict[str, Any] = {"number": 0}
    if kind == "cuda":
        subdir, ident = "linux-64", f"{name}-{version}"
        build["string"] = build_string("cuda")
        depends = [d for d in (requirement_spec(r, pythons, names) for r in info.requires) if d]
        script += _cuda_lines(wheel, info)
    elif kind == "noarch":
        subdir, ident = "noarch", f"{name}-{version}"
        build.update(noarch="python", string=build_string("noarch"))
        depends = [python_dep(info.requires_python)]
        depends += [d for d in (requirement_spec(r, pythons, names) for r in info.requires) if d]
        script += _site_packages_lines(info, "$PREFIX/site-packages")
        if info.console_scripts:
            eps = [entry_point(n, t) for n, t in sorted(info.console_scripts.items())]
            build["python"] = {"entry_points": [f"{n} = {m}:{a}" for n, m, a in eps]}
    elif kind == "python":
        python = str(entry.get("python"))
        if python not in pythons:
            raise SandboxError(f"{wheel}: python {python!r} is not one of the channel's ({', '.join(pythons)})")
        subdir, ident = "linux-64", f"{name}-{version}-py{python.replace('.', '')}"
        variant = entry.get("variant")
        if variant == "cuda":
            variant = cuda_variant(str(entry.get("cuda", "")))
        build["string"] = entry.get("build") or build_string(
            "python", python=python, variant=variant, blas=entry.get("blas")
        )
        major, minor = python.split(".")
        depends = [f"python >={python},<{major}.{int(minor) + 1}.0a0", f"python_abi {python}.* *_cp{major}{minor}"]
        depends += [d for d in (requirement_spec(r, {python: pythons[python]}, names) for r in info.requires) if d]
        script += _site_packages_lines(info, f"$PREFIX/lib/python{python}/site-packages")
        script += _console_lines(info, python)
        script += _bundle_lines(entry.get("bundle", []))
    else:
        raise SandboxError(f"{wheel}: kind {kind!r} is not noarch, python or cuda")
    build["script"] = script
    license_name = entry.get("license", info.license)
    recipe: dict[str, Any] = {
        "package": {"name": name, "version": version},
        "source": [_source(entry), *(_source(b) for b in entry.get("bundle", []))],
        "build": build,
        "requirements": {"run": depends + list(entry.get("depends", []))},
        "about": {
            "homepage": f"https://pypi.org/project/{normalize(info.project)}/",
            "summary": info.summary or f"{info.project} {info.version} from its wheel",
            **({"license": license_name} if license_name else {}),
            **({"license_file": sorted(licenses.values())} if licenses else {}),
        },
    }
    return finalize(ident, name, version, subdir, dump(recipe), channel=channel_folder(entry))


def _without(info: WheelInfo, patterns: list[str]) -> WheelInfo:
    """The wheel's metadata without the requirements whose project matches a pattern (PyTorch's
    channel's pytorch has no nvidia-* dependencies: pytorch-cuda brings CUDA, cuDNN is inside)."""
    if not patterns:
        return info
    kept = [r for r in info.requires if not any(fnmatch.fnmatch(normalize(Requirement(r).name), p) for p in patterns)]
    return dataclasses.replace(info, requires=kept)


def _bundle_lines(bundle: list[dict[str, Any]]) -> list[str]:
    """The libraries of other nvidia-* wheels, inside this package's lib/ (PyTorch's channel's
    pytorch carried its cuDNN and NCCL so)."""
    lines = []
    for wheel in bundle:
        lines += [
            f"unzip -q -o {wheel['file']} 'nvidia/*' -d bundle",
            'mkdir -p "$PREFIX/lib"',
            "find bundle/nvidia -path '*/lib/*' -name 'lib*.so*' -exec mv -t \"$PREFIX/lib\" {} +",
            "rm -rf bundle",
        ]
    return lines


def _site_packages_lines(info: WheelInfo, target: str) -> list[str]:
    return [
        f'mkdir -p "{target}"',
        *_data_lines(info, target),
        "rm -rf whl/*.dist-info/RECORD",  # its hashes no longer hold after relinking; conda owns the files
        f'find whl -mindepth 1 -maxdepth 1 -exec mv -t "{target}" {{}} +',
        f'printf "conda\\n" > "{target}/{info.dist_info}/INSTALLER"',
    ]


def _data_lines(info: WheelInfo, target: str) -> list[str]:
    """A wheel's <name>.data/: data/ goes to the prefix, purelib/ and platlib/ to site-packages."""
    if not info.data_dirs:
        return []
    places = {"data": "$PREFIX", "purelib": target, "platlib": target}
    lines = [f'cp -a whl/*.data/{d}/. "{places[d]}/"' for d in info.data_dirs]
    return [*lines, "rm -rf whl/*.data"]


def _cuda_lines(wheel: str, info: WheelInfo) -> list[str]:
    if len(info.nvidia_dirs) != 1:
        raise SandboxError(f"{wheel}: expected one nvidia/<library> folder, found {sorted(info.nvidia_dirs)}")
    lib, held = next(iter(info.nvidia_dirs.items()))
    unknown = set(held) - {"lib", "include", "bin", "__init__.py", "__pycache__"}
    if unknown:
        raise SandboxError(f"{wheel}: nvidia/{lib} holds {sorted(unknown)}, which the channel does not place")
    lines = []
    for part in ("lib", "include", "bin"):
        if part in held:
            lines += [
                f'mkdir -p "$PREFIX/{part}"',
                f"find whl/nvidia/{lib}/{part} -mindepth 1 -maxdepth 1 ! -name __init__.py ! -name __pycache__ "
                f'-exec mv -t "$PREFIX/{part}" {{}} +',
            ]
    # The development names (libcudnn.so -> libcudnn.so.9) that conda-forge's -dev packages add.
    lines.append(
        'for f in "$PREFIX"/lib/lib*.so.*; do [ -e "$f" ] || continue; b=${f##*/}; d="$PREFIX/lib/${b%%.so.*}.so"; '
        '[ -e "$d" ] || ln -s "$b" "$d"; done'
    )
    return lines


def _console_lines(info: WheelInfo, python: str) -> list[str]:
    """bin/<script> for each console script, with the environment's Python in the shebang (the
    build prefix there is replaced with the environment's at install, as for any text file)."""
    lines = ['mkdir -p "$PREFIX/bin"'] if info.console_scripts else []
    for name, module, attr in (entry_point(n, t) for n, t in sorted(info.console_scripts.items())):
        top = attr.split(".", maxsplit=1)[0]
        body = f'import sys\nfrom {module} import {top}\nif __name__ == "__main__":\n    sys.exit({attr}())\n'
        lines += [
            f'{{ printf "#!%s\\n" "$PREFIX/bin/python{python}"; cat <<"EOF"\n{body}EOF\n}} > "$PREFIX/bin/{name}"',
            f'chmod 755 "$PREFIX/bin/{name}"',
        ]
    return lines
