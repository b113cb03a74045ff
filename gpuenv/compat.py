"""The compatibility data (gpuenv/data/compat.yaml), loaded once and queried by the rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from gpuenv import versions

# The C loader is about ten times faster; check-spec must answer well inside a second.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Words nvidia-smi puts in front of model names that carry no information for matching.
_NOISE_WORDS = {"nvidia", "tesla", "geforce"}


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    url: str | None


@dataclass(frozen=True)
class TorchVariant:
    name: str
    cuda: str  # major.minor of the CUDA runtime the wheels carry
    cudnn: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    note: str | None = None

    def arch_list(self) -> list[str]:
        """As torch.cuda.get_arch_list() prints it."""
        return [f"sm_{cc.replace('.', '')}" for cc in self.sass] + [f"compute_{cc.replace('.', '')}" for cc in self.ptx]


@dataclass(frozen=True)
class TorchRelease:
    series: str  # "2.5"
    releases: tuple[str, ...]
    python_min: str
    python_max: str
    python_experimental: tuple[str, ...]
    pypi_default: str
    conda_pytorch_channel: bool
    variants: dict[str, TorchVariant]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Generation:
    name: str
    cc_min: str
    cc_max: str
    last_driver_branch: int | None
    source: str | None
    min_driver: str | None = None
    min_cuda: str | None = None


@dataclass(frozen=True)
class GpuModel:
    name: str
    cc: str
    source: str
    tokens: tuple[str, ...]
    jetson: bool = False


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    stack: dict[str, str]
    gpus: tuple[str, ...]


@dataclass
class CompatData:
    raw: dict[str, Any]
    sources: dict[str, Source]
    toolkit_driver: dict[str, str]
    minor_compat_floor: dict[str, str]
    cuda_min_cc: dict[str, str]
    cuda_min_cc_source: dict[str, str]
    first_toolkit_for_cc: dict[str, str]
    first_toolkit_source: dict[str, str]
    generations: list[Generation]
    gpu_models: list[GpuModel]
    cudnn_builds: dict[str, frozenset[str]]
    cudnn_min_cc_release: str
    cudnn_min_cc: str
    torch: dict[str, TorchRelease]
    os: dict[str, dict[str, Any]]
    profiles: dict[str, Profile]
    _release_index: dict[str, TorchRelease] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for series in self.torch.values():
            for release in series.releases:
                self._release_index[release] = series

    # --- CUDA -------------------------------------------------------------------------------
    def known_toolkits(self) -> list[str]:
        return sorted(self.toolkit_driver, key=versions.parse)

    def _releases_of(self, major_minor: str) -> list[str]:
        return [t for t in self.known_toolkits() if versions.major_minor(t) == major_minor]

    def resolve_toolkit(self, cuda: str) -> str | None:
        """ "12.4" -> the newest 12.4 update in the data ("12.4.1", what apt's cuda-toolkit-12-4 installs,
        and the stricter driver minimum); "12.4.1" -> itself."""
        if cuda in self.toolkit_driver:
            return cuda
        if cuda.count(".") == 1:
            matches = self._releases_of(cuda)
            return matches[-1] if matches else None
        return None

    def toolkit_minimum_driver(self, cuda_major_minor: str) -> str | None:
        """Minimum driver of the first release of a CUDA major.minor: what a runtime of that minor
        (torch's wheels, a GPU's first toolkit) needs at the least."""
        matches = self._releases_of(cuda_major_minor)
        return self.toolkit_driver[matches[0]] if matches else None

    # --- GPUs -------------------------------------------------------------------------------
    def generation_for_cc(self, cc: str) -> Generation | None:
        value = versions.parse(cc)
        for gen in self.generations:
            if versions.parse(gen.cc_min) <= value <= versions.parse(gen.cc_max):
                return gen
        return None

    def gpu_by_cc_jetson(self, cc: str) -> bool:
        """Whether every known model of this compute capability is a Jetson module."""
        models = [m for m in self.gpu_models if m.cc == cc]
        return bool(models) and all(m.jetson for m in models)

    def gpu_by_name(self, name: str) -> GpuModel | None:
        """Match a model as nvidia-smi prints it ("NVIDIA H100 80GB HBM3") or as people write it."""
        tokens = tokenize_gpu_name(name)
        best: GpuModel | None = None
        for model in self.gpu_models:
            if tokens[: len(model.tokens)] == model.tokens and (best is None or len(model.tokens) > len(best.tokens)):
                best = model
        return best

    # --- cuDNN ------------------------------------------------------------------------------
    def cudnn_known(self, release: str) -> bool:
        return any(release in builds for builds in self.cudnn_builds.values())

    def cudnn_in_build_range(self, release: str, cuda_major: str) -> bool:
        """Whether `release` lies between the first and last cuDNN built for that CUDA major."""
        builds = sorted(self.cudnn_builds.get(cuda_major, ()), key=versions.parse)
        return bool(builds) and versions.parse(builds[0]) <= versions.parse(release) <= versions.parse(builds[-1])

    def cudnn_cuda_majors(self, release: str) -> list[str]:
        return sorted((m for m, builds in self.cudnn_builds.items() if release in builds), key=int)

    def resolve_cudnn(self, declared: str, cuda_major: str) -> str | None:
        """A cuDNN build as people write it -> the build in the data. "8.9.2" (the release, three
        parts, as NVIDIA's downloads page names it) -> its build for that CUDA major ("8.9.2.26"),
        else its build for any major (the rules then say which majors it has); a four-part build ->
        itself when the data knows it. None when the data has no such release."""
        if declared.count(".") == 3:
            return declared if self.cudnn_known(declared) else None
        prefix = declared + "."
        for builds in (self.cudnn_builds.get(cuda_major, frozenset()), *self.cudnn_builds.values()):
            found = sorted((b for b in builds if b.startswith(prefix)), key=versions.parse)
            if found:
                return found[-1]
        return None

    def cudnn_support(self, build: str, cuda_major: str) -> dict[str, Any] | None:
        """The support-matrix entry for a cuDNN build's CUDA major: {"cuda": [lo, hi], "source",
        "packager"}, or None where the data has no range for that release."""
        for entry in _covering(self.raw["cudnn"].get("support", []), build):
            if str(entry["major"]) == cuda_major:
                return {
                    "cuda": [str(c) for c in entry["cuda"]],
                    "source": entry["source"],
                    "packager": bool(entry.get("packager")),
                }
        return None

    def cudnn_supporting(self, toolkit_xy: str, cuda_major: str) -> list[str]:
        """Builds for that CUDA major whose matrix range includes the toolkit X.Y, oldest first."""
        want = versions.parse(toolkit_xy)
        found = []
        for build in sorted(self.cudnn_builds.get(cuda_major, ()), key=versions.parse):
            entry = self.cudnn_support(build, cuda_major)
            if entry and versions.parse(entry["cuda"][0]) <= want <= versions.parse(entry["cuda"][1]):
                found.append(build)
        return found

    def cudnn_archive(self, build: str) -> dict[str, Any] | None:
        """The archive era of a cuDNN build before cuDNN 9 (name, layout, and whether NVIDIA has
        manifests for it: "none" or "some"), or None for cuDNN 9, whose manifests all exist."""
        return next((dict(e) for e in _covering(self.raw["cudnn"].get("archives", []), build)), None)

    def cudnn_manifest_known(self, build: str) -> bool:
        """Whether NVIDIA's redist manifest of that cuDNN 8 release is known to exist."""
        release = versions.CudnnVersion(build).release
        return release in {str(r) for r in self.raw["cudnn"].get("manifests", {}).get("releases", [])}

    def driver_cuda(self, driver: str | None) -> str | None:
        """The newest CUDA X.Y a declared driver fully supports (what its libcuda reports, the
        conda __cuda virtual package), from NVIDIA's table; None for no driver."""
        if not driver or driver == "none":
            return None
        fits = [v for v, floor in self.toolkit_driver.items() if versions.driver_satisfies(driver, floor)]
        return versions.major_minor(max(fits, key=versions.parse)) if fits else None

    def cudnn_matrix_min_cc(self, build: str) -> str | None:
        """The lowest compute capability NVIDIA's matrix lists for a cuDNN build, where known."""
        floor = self.raw["cudnn"].get("matrix_min_cc")
        if not floor or versions.parse(build) < versions.parse(str(floor["release"])):
            return None
        return str(floor["cc"])

    def cudnn_libraries(self, build: str) -> list[str]:
        """The shared libraries a cuDNN build's major ships ("libcudnn_cnn_infer.so.8", ...)."""
        return [str(n) for n in self.raw["cudnn"].get("libraries", {}).get(versions.CudnnVersion(build).major, [])]

    def cudnn_nearest(self, declared: str, cuda_major: str) -> list[str]:
        """The builds for that CUDA major just below and just above a release the data lacks."""
        want = versions.parse(declared)
        builds = sorted(self.cudnn_builds.get(cuda_major, ()), key=versions.parse)
        below = [b for b in builds if versions.parse(b) < want]
        above = [b for b in builds if versions.parse(b) > want]
        return below[-1:] + above[:1]

    # --- OS ---------------------------------------------------------------------------------
    def os_pythons(self, os_name: str) -> tuple[list[str], str | None]:
        """The python3.X versions an OS's own repositories ship, and the source that says so."""
        entry = (self.os.get(os_name) or {}).get("python") or {}
        return [str(v) for v in entry.get("versions", [])], entry.get("source")

    def os_from_facts(self, facts: Mapping[str, Any]) -> str | None:
        """Name the host's OS ("debian12") from its Ansible facts; None when gpuenv does not know it."""
        for key, entry in self.os.items():
            if all(str(facts.get(fact, "")) == str(want) for fact, want in entry["match"].items()):
                return str(key)
        return None

    # --- torch ------------------------------------------------------------------------------
    def torch_series(self, release: str) -> TorchRelease | None:
        return self._release_index.get(release)

    def torch_releases(self) -> list[str]:
        return sorted(self._release_index, key=versions.parse)


def tokenize_gpu_name(name: str) -> tuple[str, ...]:
    words = re.split(r"[\s\-_/]+", name.strip().lower())
    return tuple(w for w in words if w and w not in _NOISE_WORDS)


def _as_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return (str(value),)


def _build(raw: dict[str, Any]) -> CompatData:
    sources = {
        key: Source(key=key, title=entry["title"], url=entry.get("url")) for key, entry in raw["sources"].items()
    }
    cuda = raw["cuda"]
    torch: dict[str, TorchRelease] = {}
    for series, entry in raw["torch"].items():
        variants = {}
        for name, var in entry["variants"].items():
            runtime = versions.cuda_from_variant(name)
            if runtime is None:
                raise ValueError(f"compat.yaml: torch {series} variant {name!r} is not cuXYZ")
            variants[name] = TorchVariant(
                name=name,
                cuda=runtime,
                cudnn=str(var["cudnn"]),
                sass=_as_list(var["sass"]),
                ptx=_as_list(var.get("ptx")),
                note=var.get("note"),
            )
        torch[series] = TorchRelease(
            series=series,
            releases=_as_list(entry["releases"]),
            python_min=entry["python"]["min"],
            python_max=entry["python"]["max"],
            python_experimental=_as_list(entry["python"].get("experimental")),
            pypi_default=entry["pypi_default"],
            conda_pytorch_channel=bool(entry["conda_pytorch_channel"]),
            variants=variants,
            sources=_as_list(entry["source"]),
        )
    models = [
        GpuModel(
            name=name,
            cc=group["cc"],
            source=group["source"],
            tokens=tokenize_gpu_name(name),
            jetson=bool(group.get("jetson")),
        )
        for group in raw["gpu"]["models"]
        for name in group["names"]
    ]
    generations = [
        Generation(
            name=g["name"],
            cc_min=g["cc_min"],
            cc_max=g["cc_max"],
            last_driver_branch=int(g["last_driver_branch"]) if "last_driver_branch" in g else None,
            source=g.get("source"),
            min_driver=g.get("min_driver"),
            min_cuda=g.get("min_cuda"),
        )
        for g in raw["gpu"]["generations"]
    ]
    profiles = {
        name: Profile(
            name=name,
            description=p["description"],
            stack={k: str(v) for k, v in p["stack"].items()},
            gpus=_as_list(p.get("gpus")),
        )
        for name, p in raw["profiles"].items()
    }
    return CompatData(
        raw=raw,
        sources=sources,
        toolkit_driver={k: str(v) for k, v in cuda["toolkit_driver"]["linux"].items()},
        minor_compat_floor={k: v["linux"] for k, v in cuda["minor_version_compat"].items()},
        cuda_min_cc={k: v["cc"] for k, v in cuda["min_compute_capability"].items()},
        cuda_min_cc_source={k: v["source"] for k, v in cuda["min_compute_capability"].items()},
        first_toolkit_for_cc={k: v["cuda"] for k, v in cuda["first_toolkit_for_cc"].items()},
        first_toolkit_source={k: v["source"] for k, v in cuda["first_toolkit_for_cc"].items()},
        generations=generations,
        gpu_models=models,
        cudnn_builds={major: frozenset(entry["releases"]) for major, entry in raw["cudnn"]["builds"].items()},
        cudnn_min_cc_release=raw["cudnn"]["min_cc_from"]["release"],
        cudnn_min_cc=raw["cudnn"]["min_cc_from"]["cc"],
        torch=torch,
        os=raw["os"],
        profiles=profiles,
    )


@lru_cache(maxsize=1)
def load() -> CompatData:
    text = resources.files("gpuenv").joinpath("data/compat.yaml").read_text(encoding="utf-8")
    return _build(yaml.load(text, Loader=_Loader))  # noqa: S506 - CSafeLoader/SafeLoader only


def _covering(entries: list[dict[str, Any]], build: str) -> list[dict[str, Any]]:
    """The data's release-range entries ({first, last, ...}) whose range holds a cuDNN build's
    release (X.Y.Z), in their order."""
    release = versions.parse(build)[:3]
    return [e for e in entries if versions.parse(str(e["first"])) <= release <= versions.parse(str(e["last"]))]
