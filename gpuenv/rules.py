"""The compatibility rules: one function per rule, each returning what it found with why and fix.

The same :func:`check` serves `gpuenv check-spec` and the playbooks' preflight (through the
filter plugin in plugins/filter/), so the command line and site.yml cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuenv import archcompat, services, versions
from gpuenv.compat import CompatData, TorchRelease, TorchVariant, load
from gpuenv.stack import Stack

ERROR = "error"
WARNING = "warning"

EXIT_OK = 0
EXIT_INCOMPATIBLE = 1
EXIT_INVALID = 2


@dataclass
class Finding:
    rule: str
    severity: str
    message: str
    why: str
    fix: str
    sources: list[str] = field(default_factory=list)


@dataclass
class Gpu:
    label: str
    cc: str
    origin: str  # "declared" or "detected"
    generation: str | None = None


@dataclass
class Report:
    stack: Stack
    gpus: list[Gpu]
    findings: list[Finding]
    resolved: dict[str, Any]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def exit_code(self) -> int:
        return EXIT_INCOMPATIBLE if self.errors else EXIT_OK

    @property
    def verdict(self) -> str:
        return "incompatible" if self.errors else "compatible"


# Evidence for the wheels' architecture lists (the torch entries' other sources cover releases,
# Python versions and variants).
ARCH_SOURCES = ("pt_builder", "pt_build_cuda", "moi90_measured")


class _Checker:
    def __init__(self, stack: Stack, data: CompatData, cudnn_fetch: str = "manifest") -> None:
        self.stack = stack
        self.data = data
        # How the cudnn role gets its tarball (cudnn_fetch_mode of the settings beside the stack).
        self.cudnn_fetch = cudnn_fetch
        self.findings: list[Finding] = []
        self.gpus: list[Gpu] = []
        self.toolkit: str | None = None
        # The system cuDNN's build, resolved from what the stack declares ("8.9.2" -> "8.9.2.26").
        self.cudnn: str | None = None
        self.series: TorchRelease | None = None
        self.variant: TorchVariant | None = None
        self.variant_derived = False
        self.host_os: str | None = None
        self.nvswitches: list[dict[str, str]] = []

    def add(self, rule: str, severity: str, message: str, why: str, fix: str, *sources: str) -> None:
        self.findings.append(Finding(rule, severity, message, why, fix, list(sources)))

    # --- GPUs ----------------------------------------------------------------------------------
    def _add_gpu(self, label: str, cc: str, origin: str) -> None:
        """Identical GPUs (an 8-GPU host) are checked once, under one entry."""
        cc = versions.fmt(versions.parse(cc))  # "12.00" and "12.0" are the same compute capability
        for gpu in self.gpus:
            if gpu.cc == cc and gpu.origin == origin:
                if label not in gpu.label.split(", "):
                    gpu.label = f"{gpu.label}, {label}"
                return
        self.gpus.append(Gpu(label, cc, origin))

    def resolve_gpus(self, detected: Iterable[Mapping[str, str]]) -> None:
        for label in dict.fromkeys(self.stack.gpus):
            cc = self._cc_for(label)
            if cc is not None:
                self._add_gpu(label, cc, "declared")
        for probe in detected:
            name, cc = str(probe.get("name", ""))[:200], str(probe.get("cc", ""))
            if not re.fullmatch(r"\d{1,3}\.\d{1,3}", cc):
                found = self.data.gpu_by_name(name)
                if found is None:
                    self.add(
                        "gpu-unknown",
                        WARNING,
                        f"the host reports GPU {name!r} without a compute capability gpuenv can read",
                        "nvidia-smi gave no compute capability for it, and the model is not in gpuenv's data",
                        'declare the GPU\'s compute capability in gpu_stack.gpu, e.g. gpu: "8.6"',
                        "nv_cuda_gpus",
                    )
                    continue
                cc = found.cc
            self._add_gpu(name or cc, cc, "detected")
        for gpu in self.gpus:
            gen = self.data.generation_for_cc(gpu.cc)
            gpu.generation = gen.name if gen else None
            if gen is None:
                self.add(
                    "gpu-unknown-cc",
                    WARNING,
                    f"compute capability {gpu.cc} ({gpu.label}) belongs to no GPU generation gpuenv knows",
                    "only the torch build's architecture rule could be applied; driver and toolkit rules per "
                    "generation could not",
                    "check the value (nvidia-smi --query-gpu=compute_cap --format=csv)",
                    "nv_cuda_gpus",
                )
            elif self.data.gpu_by_cc_jetson(gpu.cc):
                self.add(
                    "gpu-jetson",
                    WARNING,
                    f"compute capability {gpu.cc} ({gpu.label}) is a Jetson module",
                    "Jetson runs JetPack (L4T) with its own driver and aarch64 wheels; gpuenv's driver branch and "
                    "x86_64 wheel rules do not describe it",
                    "provision Jetson with NVIDIA JetPack; use gpuenv for x86_64 GPU hosts",
                    "nv_jetson",
                )
        declared = {g.cc for g in self.gpus if g.origin == "declared"}
        detected_cc = {g.cc for g in self.gpus if g.origin == "detected"}
        if declared and detected_cc and declared != detected_cc:
            self.add(
                "gpu-declared-vs-detected",
                WARNING,
                f"gpu_stack.gpu declares compute capability {', '.join(sorted(declared))} but the host has "
                f"{', '.join(sorted(detected_cc))}",
                "the stack file describes other GPUs than this host has; both were checked",
                "correct gpu_stack.gpu for this group, or move the host to a group whose stack fits it",
                "derived",
            )

    def _cc_for(self, label: str) -> str | None:
        cc = gpu_cc(label, self.data)
        if cc is not None:
            return cc
        self.add(
            "gpu-unknown",
            ERROR,
            f"GPU {label!r} is not a model gpuenv knows",
            "without its compute capability gpuenv cannot tell whether the torch build has kernels for it",
            'write its compute capability instead, e.g. gpu: "8.9" '
            "(nvidia-smi --query-gpu=name,compute_cap --format=csv prints it; NVIDIA lists them at "
            "https://developer.nvidia.com/cuda-gpus)",
            "nv_cuda_gpus",
        )
        return None

    # --- CUDA toolkit and torch --------------------------------------------------------------
    def check_toolkit(self) -> None:
        self.toolkit = self.data.resolve_toolkit(self.stack.cuda)
        if self.toolkit is None:
            known = self.data.known_toolkits()
            self.add(
                "cuda-unknown",
                ERROR,
                f"CUDA {self.stack.cuda} is not in gpuenv's compatibility data",
                "gpuenv installs only what it can check, and it has no driver minimum for this release",
                f"use a CUDA release from {known[0]} to {known[-1]} (X.Y.Z, as NVIDIA numbers updates), "
                "or add the release with its source to gpuenv/data/compat.yaml",
                "nv_rn_table3",
            )

    def check_torch(self) -> None:
        stack, data = self.stack, self.data
        self.series = data.torch_series(stack.torch)
        if self.series is None:
            same = data.torch.get(versions.major_minor(stack.torch))
            hint = (
                f"torch {same.series} has {', '.join(same.releases)}"
                if same
                else f"known releases: {', '.join(data.torch_releases()[-6:])} "
                f"and older back to {data.torch_releases()[0]}"
            )
            self.add(
                "torch-unknown",
                ERROR,
                f"torch {stack.torch} is not in gpuenv's compatibility data",
                "gpuenv installs only releases whose wheels, CUDA variants and architectures it knows",
                f"pick a known release ({hint}), or add it with sources to gpuenv/data/compat.yaml",
                "pypi_torch",
            )
            return
        series = self.series
        variants = ", ".join(series.variants)
        if stack.torch_variant is not None:
            self.variant = series.variants.get(stack.torch_variant)
            if self.variant is None:
                self.add(
                    "torch-variant",
                    ERROR,
                    f"torch {stack.torch} has no {stack.torch_variant} build",
                    f"PyTorch published torch {series.series} for Linux with {variants} only",
                    f"set torch_variant to one of {variants}, or choose a torch release that has "
                    f"{stack.torch_variant}{self._releases_with_variant(stack.torch_variant)}",
                    *series.sources,
                )
            return
        derived = versions.variant_from_cuda(self.toolkit or stack.cuda)
        self.variant = series.variants.get(derived)
        if self.variant is not None:
            self.variant_derived = True
            return
        usable = [
            v
            for v in series.variants.values()
            if versions.parse(v.cuda) <= versions.parse(versions.major_minor(stack.cuda))
        ]
        suggestion = (
            f"set torch_variant: {usable[-1].name} (torch wheels carry their own CUDA runtime, so a "
            f"variant older than the toolkit works)"
            if usable
            else f"set torch_variant to one of {variants}"
        )
        self.add(
            "torch-variant",
            ERROR,
            f"torch {stack.torch} has no {derived} build, the variant derived from CUDA {stack.cuda}",
            f"PyTorch published torch {series.series} for Linux with {variants} only",
            f"{suggestion}, or choose a torch release that has {derived}{self._releases_with_variant(derived)}",
            *series.sources,
        )

    def _releases_with_variant(self, variant: str) -> str:
        series = [s.series for s in self.data.torch.values() if variant in s.variants]
        return f" (torch {', '.join(series)})" if series else " (no release in the data has it)"

    def check_python(self) -> None:
        series, py = self.series, self.stack.python
        if series is None:
            return
        value = versions.parse(py)
        if versions.parse(series.python_min) <= value <= versions.parse(series.python_max):
            return
        sources = list(series.sources)
        if py in series.python_experimental:
            self.add(
                "torch-python",
                WARNING,
                f"Python {py} support in torch {series.series} is experimental",
                f"PyTorch's release matrix marks Python {py} experimental for torch {series.series}",
                f"use Python {series.python_max} for a supported combination",
                *sources,
            )
            return
        fitting = [
            s.series
            for s in self.data.torch.values()
            if versions.parse(s.python_min) <= value <= versions.parse(s.python_max)
        ]
        other = f"; torch releases that support Python {py}: {', '.join(fitting)}" if fitting else ""
        self.add(
            "torch-python",
            ERROR,
            f"torch {self.stack.torch} has no wheels for Python {py}",
            f"torch {series.series} supports Python {series.python_min} to {series.python_max}",
            f"set python to a version from {series.python_min} to {series.python_max}{other}",
            *sources,
        )

    # --- driver ------------------------------------------------------------------------------
    def _check_driver_against(self, what: str, minimum: str, cuda_major: str, rule: str, source: str) -> None:
        found = driver_against(self.data, self.stack.driver, what, minimum, cuda_major, rule, source)
        if found is not None:
            self.findings.append(found)

    def check_driver(self) -> None:
        if self.toolkit is not None:
            self._check_driver_against(
                f"CUDA {self.toolkit}",
                self.data.toolkit_driver[self.toolkit],
                str(versions.major(self.toolkit)),
                "driver-cuda",
                "nv_rn_table3",
            )
        if self.variant is not None:
            minimum = self.data.toolkit_minimum_driver(self.variant.cuda)
            what = f"torch {self.stack.torch}+{self.variant.name} (CUDA {self.variant.cuda} runtime)"
            if minimum is None:
                self.add(
                    "driver-torch-cuda",
                    WARNING,
                    f"gpuenv has no driver minimum for CUDA {self.variant.cuda}, the runtime of {what}",
                    "the driver table starts at CUDA 11.0",
                    "check NVIDIA's release notes for the driver this CUDA needs",
                    "nv_rn_table3",
                )
            else:
                self._check_driver_against(
                    what, minimum, str(versions.major(self.variant.cuda)), "driver-torch-cuda", "nv_rn_table3"
                )
            if self.toolkit is not None and versions.major(self.toolkit) != versions.major(self.variant.cuda):
                self.add(
                    "toolkit-torch-major",
                    WARNING,
                    f"CUDA toolkit {self.toolkit} and torch's CUDA {self.variant.cuda} differ in major version",
                    "torch runs with its own CUDA runtime, but building CUDA extensions "
                    "(torch.utils.cpp_extension, pip packages that compile kernels) needs a toolkit of the same major",
                    f"use a CUDA {versions.major(self.variant.cuda)}.x toolkit if anyone builds extensions",
                    "pt_cpp_extension",
                )

    # --- cuDNN -------------------------------------------------------------------------------
    def check_cudnn(self) -> None:
        declared = self.stack.cudnn
        if declared == "none" or self.toolkit is None:
            return
        major = str(versions.major(self.toolkit))
        build = self.data.resolve_cudnn(declared, major)
        if build is None:
            nearest = self.data.cudnn_nearest(declared, major)
            self.add(
                "cudnn-unknown",
                ERROR,
                f"cuDNN {declared} is not a release gpuenv knows for CUDA {major}",
                "gpuenv installs a system cuDNN only from a build in its data (release and build, e.g. 9.1.0.70, "
                "with the CUDA toolkits NVIDIA lists for it)",
                f"use a release gpuenv has for CUDA {major}: the nearest are {' and '.join(nearest)}"
                if nearest
                else f"gpuenv has no cuDNN for CUDA {major}; set cudnn: none",
                "pypi_cudnn",
            )
            return
        self.cudnn = cudnn = build
        majors = self.data.cudnn_cuda_majors(cudnn)
        if major in majors:
            self._check_cudnn_minor(cudnn, major)
            self._check_cudnn_archive(cudnn)
            return
        builds = sorted(self.data.cudnn_builds.get(major, ()), key=versions.parse)
        pick = f"e.g. {builds[-1]} (the newest with a CUDA {major} build)" if builds else "none"
        if self.data.cudnn_in_build_range(cudnn, major):
            # Between the first and last cuDNN built for this major: NVIDIA's tarballs include
            # builds that PyPI's wheels (the build lists' source) lack, e.g. 8.9.7.29 for CUDA 11.
            self.add(
                "cudnn-cuda",
                WARNING,
                f"cuDNN {cudnn} for CUDA {major} is not on PyPI; gpuenv cannot confirm NVIDIA built it",
                f"cuDNN releases around it were built for CUDA {major}, so a tarball may exist",
                f"make sure cudnn-linux-x86_64-{cudnn}_cuda{major}-archive.tar.xz is on your mirror, or choose {pick}",
                "pypi_cudnn",
            )
            return
        self.add(
            "cudnn-cuda",
            ERROR,
            f"cuDNN {cudnn} has no build for CUDA {major} (CUDA {self.toolkit})",
            f"NVIDIA built cuDNN {cudnn} for CUDA {', '.join(majors)} only; CUDA {major} builds run from "
            f"{builds[0]} to {builds[-1]}"
            if builds
            else f"no cuDNN is built for CUDA {major}",
            f"choose a cuDNN built for CUDA {major}, {pick}, or set cudnn: none",
            "pypi_cudnn",
        )

    def _check_cudnn_archive(self, build: str) -> None:
        """Whether the cudnn role can find the build's tarball: cuDNN 9 and some cuDNN 8 releases
        have NVIDIA's redist manifest, the .tgz era has none (its tarball must be given)."""
        era = self.data.cudnn_archive(build)
        if era is None or self.cudnn_fetch != "manifest":
            return
        give = (
            "set cudnn_tarball_url (your mirror's copy, or file:///path on the controller) or cudnn_tarball_path, "
            'with cudnn_tarball_checksum: "sha256:<hex>" of that file'
        )
        if era["manifest"] == "none":
            self.add(
                "cudnn-archive",
                ERROR,
                f"cuDNN {build} has no redist manifest for the cudnn role to find its tarball by",
                f"NVIDIA shipped cuDNN {era['first']} to {era['last']} as {era['name']} ({era['layout']}), before "
                "its redist manifests existed; the role installs that layout, but only from a tarball it is given",
                give + " (the .tgz you downloaded from NVIDIA's archive), or cudnn: none (torch's wheels bring "
                "their own cuDNN)",
                era["source"],
            )
            return
        if self.data.cudnn_manifest_known(build):
            return
        self.add(
            "cudnn-archive",
            WARNING,
            f"NVIDIA's redist manifest for cuDNN {build} is not known to exist",
            f"cuDNN {era['first']} to {era['last']} ship as {era['name']}; NVIDIA has manifests for some of these "
            "releases only, named redistrib_<X.Y.Z>.json or redistrib_<build>.json, and the role asks for both",
            f"if your mirror has neither, {give}",
            era["source"],
            "xla_cudnn_manifests",
        )

    def _check_cudnn_minor(self, build: str, major: str) -> None:
        """The build of a CUDA major supports a range of that major's toolkits (NVIDIA's matrix)."""
        entry = self.data.cudnn_support(build, major)
        toolkit_xy = versions.major_minor(self.toolkit or "")
        if entry is None or not toolkit_xy:
            return
        low, high = entry["cuda"]
        if versions.parse(low) <= versions.parse(toolkit_xy) <= versions.parse(high):
            return
        supporting = self.data.cudnn_supporting(toolkit_xy, major)
        # Another build of the same cuDNN major first (a new major changes the sonames, .so.8 to
        # .so.9, that software built against this cuDNN links to), and NVIDIA's ranges before a
        # packager's reading of them.
        same = [b for b in supporting if b.partition(".")[0] == build.partition(".")[0]]
        official = [b for b in supporting if not (self.data.cudnn_support(b, major) or {}).get("packager")]
        fitting = [b for b in same if b in official] or same or official or supporting
        whose = "a packager's reading of NVIDIA's support matrix" if entry["packager"] else "NVIDIA's support matrix"
        self.add(
            "cudnn-cuda-minor",
            WARNING if entry["packager"] else ERROR,
            f"cuDNN {build} for CUDA {major} supports CUDA {low} to {high}, not {toolkit_xy} (CUDA {self.toolkit})",
            f"{whose} lists CUDA {low} to {high} for this build; outside it cuDNN may fail to load or misbehave",
            f"use a cuDNN whose matrix lists CUDA {toolkit_xy}, e.g. {fitting[-1]}"
            if fitting
            else f"use a CUDA {major} toolkit from {low} to {high}, or set cudnn: none",
            entry["source"],
        )

    # --- per GPU -----------------------------------------------------------------------------
    def check_gpu(self, gpu: Gpu) -> None:
        label = gpu.label if gpu.label == gpu.cc else f"{gpu.label}, CC {gpu.cc}"
        cc = versions.parse(gpu.cc)
        gen = self.data.generation_for_cc(gpu.cc)
        gen_name = gen.name.capitalize() if gen else "this GPU"
        if self.variant is not None and not covers(self.variant, gpu.cc):
            arch = " ".join(self.variant.arch_list())
            self.add(
                "gpu-torch-arch",
                ERROR,
                f"torch {self.stack.torch}+{self.variant.name} has no kernels for compute capability "
                f"{gpu.cc} ({gpu.label})"
                if gpu.label != gpu.cc
                else f"torch {self.stack.torch}+{self.variant.name} has no kernels for compute capability {gpu.cc}",
                f"its wheels carry {arch}; a GPU of CC {gpu.cc} runs SASS of the same major with a lower or "
                f'equal minor, or PTX of a lower or equal CC, so every kernel launch fails with "no kernel '
                'image is available for execution on the device"',
                self._arch_fix(gpu.cc),
                *ARCH_SOURCES,
            )
        if self.toolkit is not None:
            major = str(versions.major(self.toolkit))
            min_cc = self.data.cuda_min_cc.get(major)
            if min_cc is not None and cc < versions.parse(min_cc):
                self.add(
                    "gpu-cuda-toolkit",
                    ERROR,
                    f"CUDA {self.toolkit} does not support compute capability {gpu.cc} ({label})",
                    f"CUDA {major}.x builds only for compute capability {min_cc} and newer",
                    f"use a CUDA {int(major) - 1}.x toolkit for this GPU"
                    + (" (profile torch-2.9-cu126-legacy is one such stack)" if major == "13" else ""),
                    self.data.cuda_min_cc_source[major],
                )
        first, first_driver, floor_source = self._gpu_floor(gpu.cc)
        if (
            self.toolkit is not None
            and first is not None
            and versions.parse(versions.major_minor(self.toolkit)) < versions.parse(first)
        ):
            self.add(
                "gpu-cuda-toolkit",
                ERROR,
                f"CUDA {self.toolkit} predates compute capability {gpu.cc} ({label})",
                f"CUDA supports compute capability {gpu.cc} from {first} on",
                f"use CUDA {first} or newer",
                floor_source,
            )
        driver_branch = versions.driver_branch(self.stack.driver)
        if gen is not None and gen.last_driver_branch is not None and driver_branch > gen.last_driver_branch:
            self.add(
                "gpu-driver-eol",
                ERROR,
                f"driver {self.stack.driver} no longer supports {gen_name} GPUs ({label})",
                f"R{gen.last_driver_branch} is the last driver branch for {gen_name}; newer drivers refuse the GPU",
                f'pin driver: "{gen.last_driver_branch}" (and a CUDA/torch that it supports, e.g. profile '
                "torch-2.9-cu126-legacy)",
                gen.source or "nv_driver_deprecation",
            )
        if first_driver is not None and not versions.driver_satisfies(self.stack.driver, first_driver):
            self.add(
                "gpu-driver-too-old",
                ERROR,
                f"driver {self.stack.driver} is too old for compute capability {gpu.cc} ({label})",
                f"{gen_name} GPUs arrived with CUDA {first}, whose driver is {first_driver}; older drivers "
                "do not know the GPU",
                f'set driver: "{versions.driver_branch(first_driver)}" or newer',
                floor_source,
                "nv_rn_table3",
                "derived",
            )
        self._check_cudnn_cc(gpu, label)

    def _gpu_floor(self, cc: str) -> tuple[str | None, str | None, str]:
        """The first CUDA release and the lowest driver for a compute capability, and their source.

        The exact CC's first toolkit where the data has it, else its generation's floor (Blackwell
        CCs 10.3, 11.0 and 12.1 have no first toolkit of their own in the data)."""
        first = self.data.first_toolkit_for_cc.get(cc)
        source = self.data.first_toolkit_source.get(cc, "derived")
        gen = self.data.generation_for_cc(cc)
        if first is None and gen is not None and gen.min_cuda is not None:
            first, source = gen.min_cuda, gen.source or "derived"
        driver = self.data.toolkit_minimum_driver(first) if first else None
        if (
            gen is not None
            and gen.min_driver is not None
            and (driver is None or versions.parse(gen.min_driver) > versions.parse(driver))
        ):
            driver = gen.min_driver
        return first, driver, source

    def _check_cudnn_cc(self, gpu: Gpu, label: str) -> None:
        floor_cc = self.data.cudnn_matrix_min_cc(self.cudnn) if self.cudnn else None
        if floor_cc is not None and versions.parse(gpu.cc) < versions.parse(floor_cc):
            floor = self.data.raw["cudnn"]["matrix_min_cc"]
            self.add(
                "gpu-cudnn-cc",
                ERROR,
                f"the system cuDNN {self.cudnn} does not support compute capability {gpu.cc} ({label})",
                f"NVIDIA's support matrix for cuDNN {floor['release']} and newer lists compute capability "
                f"{floor_cc} and up; code built against this cuDNN fails on the GPU",
                "set cudnn: none (torch's wheels bring their own), or a cuDNN release below "
                f"{floor['release']} whose matrix lists {gpu.cc}",
                str(floor["source"]),
            )
        if versions.parse(gpu.cc) >= versions.parse(self.data.cudnn_min_cc):
            return
        floor = versions.parse(self.data.cudnn_min_cc_release)
        candidates = []
        if self.stack.cudnn != "none":
            candidates.append(
                (
                    f"the system cuDNN {self.cudnn or self.stack.cudnn}",
                    self.cudnn or self.stack.cudnn,
                    "set cudnn to a release below 9.11, e.g. 9.10.2.21",
                )
            )
        if self.variant is not None:
            candidates.append(
                (
                    f"torch {self.stack.torch}+{self.variant.name}'s cuDNN {self.variant.cudnn}",
                    self.variant.cudnn,
                    "use a torch build that ships cuDNN < 9.11, e.g. a cu126 variant (profile torch-2.9-cu126-legacy)",
                )
            )
        for what, release, fix in candidates:
            if versions.parse(release) >= floor:
                self.add(
                    "gpu-cudnn-sm75",
                    ERROR,
                    f"{what} does not support compute capability {gpu.cc} ({label})",
                    f"cuDNN {self.data.cudnn_min_cc_release} and newer need compute capability "
                    f'{self.data.cudnn_min_cc}; torch raises "cuDNN version ... is not compatible with devices '
                    'with SM < 7.5"',
                    fix,
                    "pt_cudnn_sm75",
                )

    def _arch_fix(self, cc: str) -> str:
        """The nearest torch build that has kernels for `cc`: same release first, then newer, then older."""
        series = self.series
        if series is not None:
            same = [v.name for v in series.variants.values() if covers(v, cc)]
            if same:
                return f"set torch_variant: {same[-1]} (torch {self.stack.torch} has kernels for {cc} there)"
        ordered = sorted(self.data.torch.values(), key=lambda s: versions.parse(s.series))
        current = versions.parse(series.series) if series else (0,)
        newer = [
            (s, v) for s in ordered if versions.parse(s.series) > current for v in s.variants.values() if covers(v, cc)
        ]
        if newer:
            s, v = newer[0]
            return f"use torch >= {s.series} with {v.name} (for example torch {s.releases[-1]}, torch_variant {v.name})"
        older = [
            (s, v) for s in ordered if versions.parse(s.series) < current for v in s.variants.values() if covers(v, cc)
        ]
        if older:
            s, v = older[-1]
            return f"use torch {s.releases[-1]} with {v.name}, the newest release with kernels for {cc}"
        return f"no PyTorch release in gpuenv's data has kernels for compute capability {cc}"

    # --- OS ----------------------------------------------------------------------------------
    def check_os(self, host_facts: Mapping[str, Any] | None) -> None:
        if host_facts is None:
            return
        host_os = self.data.os_from_facts(host_facts)
        label = " ".join(str(host_facts.get(k, "")) for k in ("distribution", "distribution_version")).strip()
        if host_os is None:
            self.add(
                "os-unknown",
                WARNING,
                f"the host runs {label or 'an OS gpuenv cannot name'}, which gpuenv does not know",
                f"gpuenv's roles are written and tested for {', '.join(self.data.os)}",
                "expect the roles to stop on this host; use one of those OS releases",
                "derived",
            )
            return
        self.host_os = host_os
        if self.stack.os is not None and host_os != self.stack.os:
            self.add(
                "os-mismatch",
                ERROR,
                f"gpu_stack.os is {self.stack.os} but the host runs {host_os} ({label})",
                "the stack was declared and checked for another OS; packages and driver sources differ",
                f"set gpu_stack.os: {host_os} for this group, or move the host to a group for {host_os}",
                "derived",
            )

    def check_fabric(self, nvswitches: Iterable[Mapping[str, str]], settings: Mapping[str, Any] | None) -> None:
        """An NVSwitch board (HGX) runs no CUDA until Fabric Manager, of exactly the driver's version,
        has set its switches up: refuse a driver the host cannot get a matching Fabric Manager for.
        settings: gpu_services_fabricmanager and nvidia_driver_source beside the stack (None: those
        roles' defaults, auto and debian). Whether the repository has the exact version is checked by
        gpu_services against the repository's index."""
        self.nvswitches = [dict(s) for s in nvswitches]
        if not self.nvswitches:
            return
        settings = settings or {}
        given = settings.get("gpu_services_fabricmanager")
        mode = "auto" if given is None else services.mode_of(given)
        source = str(settings.get("nvidia_driver_source") or "debian")
        switches = services.nvswitch_summary(self.nvswitches)
        why = (
            "on an NVSwitch board CUDA fails to initialise until NVIDIA Fabric Manager, of exactly the driver's "
            "version, has configured the switches"
        )
        entry = self.data.raw["services"]["fabric_manager"]
        branch = self.stack.driver.split(".")[0]
        if mode == "off":
            self.add(
                "fabric-manager",
                ERROR,
                f"the host has {switches} and gpu_services_fabricmanager is off",
                f"{why}; gpuenv would set driver {self.stack.driver} up without the Fabric Manager that must match it",
                "set gpu_services_fabricmanager: auto (or on): gpu_services installs nvidia-fabricmanager of the "
                "driver's version and holds it with the driver",
                "nv_fm_guide",
            )
        elif source == "debian":
            self.add(
                "fabric-manager",
                ERROR,
                f"the host has {switches}, and Debian's driver packages (nvidia_driver_source: debian) come "
                "with no Fabric Manager",
                f"{why}; Debian's archive has no Fabric Manager package, NVIDIA's repository has one for each "
                "driver version",
                "set nvidia_driver_source: nvidia_repo for this host's group (NVIDIA's repository carries "
                "nvidia-fabricmanager of every driver version)",
                "nv_fm_guide",
                "debian_packages",
            )
        elif branch.isdigit() and int(branch) < int(entry["first_branch"]):
            self.add(
                "fabric-manager",
                ERROR,
                f"the host has {switches}, and driver {self.stack.driver} is older than the first branch with "
                f"Fabric Manager packages (R{entry['first_branch']})",
                f"{why}; NVIDIA packages Fabric Manager from R{entry['first_branch']} on",
                f"pin a driver of R{entry['first_branch']} or newer in gpu_stack.driver",
                "nv_fm_guide",
                entry["source"],
            )

    def check_os_python(self, backend: str | None) -> None:
        """The venv backend builds from the OS's python3.X package: a Python the OS does not ship
        fails on the host only after the driver and CUDA stages changed it, so refuse it here."""
        os_name = self.host_os or self.stack.os
        mismatch = any(f.rule == "os-mismatch" for f in self.findings)  # that error comes first
        if os_name is None or mismatch or (backend or "venv") != "venv":
            return
        shipped, source = self.data.os_pythons(os_name)
        py = self.stack.python
        if not shipped or py in shipped:
            return
        others = [name for name in self.data.os if py in self.data.os_pythons(name)[0]]
        where = f", or an OS that ships it ({', '.join(others)})" if others else ""
        sources = [source or "derived", *(self.data.os_pythons(name)[1] or "derived" for name in others)]
        self.add(
            "os-python",
            ERROR,
            f"Python {py} is not packaged for {os_name}, which ships {', '.join(shipped)}",
            f"the venv backend builds the environment from the OS's python{py} package, and {os_name}'s "
            "repositories have none; the conda backend brings its own Python from its channel",
            f'set python: "{shipped[-1]}" for {os_name}, or pytorch_env_backend: conda{where}',
            *dict.fromkeys(sources),
        )

    def resolved(self) -> dict[str, Any]:
        out = self.stack.as_dict()
        out["cuda"] = self.toolkit or self.stack.cuda
        out["cuda_declared"] = self.stack.cuda
        out["cudnn"] = self.cudnn or self.stack.cudnn
        out["cudnn_declared"] = self.stack.cudnn
        # What verify checks the loader resolves to the tree's own files.
        out["cudnn_libraries"] = self.data.cudnn_libraries(self.cudnn) if self.cudnn else []
        # Derived once here, read by the roles (none of them re-derives a version from a string).
        cuda = out["cuda"] if out["cuda"] not in (None, "none") else None
        out["cuda_xy"] = versions.major_minor(cuda) if cuda else None
        out["cuda_major"] = str(versions.major(cuda)) if cuda else None
        out["cuda_tree"] = f"/usr/local/cuda-{out['cuda_xy']}" if cuda else None
        out["cudnn_release"] = ".".join(self.cudnn.split(".")[:3]) if self.cudnn else None
        out["cudnn_major"] = self.cudnn.split(".", 1)[0] if self.cudnn else None
        # The CUDA the declared driver supports: what a conda solve takes the host to have (__cuda).
        out["driver_cuda"] = self.data.driver_cuda(self.stack.driver)
        out["torch_variant"] = self.variant.name if self.variant else self.stack.torch_variant
        out["torch_variant_derived"] = self.variant_derived
        out["torch_cuda"] = self.variant.cuda if self.variant else None
        out["torch_cudnn"] = self.variant.cudnn if self.variant else None
        # The oldest driver that runs torch's CUDA runtime at all (minor-version compatibility): what
        # gpuenv verify holds the host's driver to.
        out["torch_min_driver"] = (
            self.data.minor_compat_floor.get(self.variant.cuda.split(".")[0]) if self.variant else None
        )
        out["torch_arch_list"] = self.variant.arch_list() if self.variant else []
        out["torch_pypi_default"] = bool(self.series and self.variant and self.series.pypi_default == self.variant.name)
        out["torch_conda_pytorch_channel"] = bool(self.series and self.series.conda_pytorch_channel)
        out["from_profile"] = self.stack.from_profile
        out["host_os"] = self.host_os
        # The NVSwitch chips the preflight found on the PCI bus (gpu_services' Fabric Manager: auto).
        out["nvswitches"] = self.nvswitches
        out["gpus"] = [
            {"label": g.label, "cc": g.cc, "origin": g.origin, "generation": g.generation} for g in self.gpus
        ]
        return out


def driver_against(  # noqa: PLR0917 - the finding's parts, in the order it reads
    data: CompatData, driver: str, what: str, minimum: str, cuda_major: str, rule: str, source: str
) -> Finding | None:
    """Whether `driver` runs `what` (a toolkit, torch's CUDA runtime), which NVIDIA released with
    `minimum`: None when it does; a warning when only CUDA minor-version compatibility covers it (the
    driver is at or above the floor of that CUDA major); an error below the floor. check-spec judges
    declared stacks with it, gpuenv doctor the drivers and environments it finds on a host."""
    floor = data.minor_compat_floor.get(cuda_major)
    if versions.driver_satisfies(driver, minimum):
        return None
    if floor is not None and versions.driver_satisfies(driver, floor):
        return Finding(
            rule,
            WARNING,
            f"driver {driver} is older than {what} was released with (>= {minimum}) and relies on "
            f"CUDA minor-version compatibility",
            f"drivers >= {floor} run any CUDA {cuda_major}.x application with a limited feature set: "
            "PTX newer than the driver cannot be JIT-compiled",
            f"use driver >= {minimum} (branch {versions.driver_branch(minimum)}) for full support",
            [source, "nv_mvc"],
        )
    need = f"at least {floor} through minor-version compatibility, " if floor else ""
    return Finding(
        rule,
        ERROR,
        f"driver {driver} is too old for {what}",
        f"{what} needs {need}and {minimum} for full support; older drivers fail with "
        '"CUDA driver version is insufficient for CUDA runtime version"',
        f'set driver: "{versions.driver_branch(minimum)}" or newer, or pick an older CUDA',
        [source, "nv_mvc"],
    )


def gpu_cc(label: str, data: CompatData) -> str | None:
    """The compute capability a declared GPU stands for: "8.6", "sm_86" or a model name; None when
    gpuenv does not know the model (the rules then report gpu-unknown)."""
    if re.fullmatch(r"\d{1,3}\.\d{1,3}", label):
        return label
    match = re.fullmatch(r"sm_(\d+)(\d)", label.lower())
    if match:
        return f"{int(match.group(1))}.{match.group(2)}"
    model = data.gpu_by_name(label)
    return model.cc if model is not None else None


def covers(variant: TorchVariant, cc: str) -> bool:
    """Whether the variant's kernels run on compute capability `cc`, under NVIDIA's
    binary-compatibility rule (gpuenv.archcompat, the rule verify applies on the hosts too)."""
    return archcompat.runs_on(cc, variant.arch_list())[0]


def check(
    stack: Stack,
    data: CompatData | None = None,
    host_gpus: Iterable[Mapping[str, str]] = (),
    host_facts: Mapping[str, Any] | None = None,
    backend: str | None = None,
    *,
    cudnn_fetch: str = "manifest",
    nvswitches: Iterable[Mapping[str, str]] = (),
    services_settings: Mapping[str, Any] | None = None,
) -> Report:
    """Judge a well-formed stack (and, where given, the host's GPUs, NVSwitches and OS, the
    environment's backend, how the cudnn role gets its tarball: cudnn_fetch_mode, and the driver
    and services settings check_fabric reads) against the data."""
    checker = _Checker(stack, data or load(), cudnn_fetch)
    checker.resolve_gpus(host_gpus)
    checker.check_toolkit()
    checker.check_torch()
    checker.check_python()
    checker.check_driver()
    checker.check_cudnn()
    for gpu in checker.gpus:
        checker.check_gpu(gpu)
    checker.check_os(host_facts)
    checker.check_os_python(backend)
    checker.check_fabric(nvswitches, services_settings)
    return Report(stack=stack, gpus=checker.gpus, findings=checker.findings, resolved=checker.resolved())
