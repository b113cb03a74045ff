"""The rules per GPU: which GPUs the stack is for (declared and detected), and whether the torch
build, the toolkit, the driver and the system cuDNN serve each one's compute capability."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpuenv import versions
from gpuenv.rules.base import ERROR, WARNING, CheckerBase, Gpu, covers, gpu_cc

# Evidence for the wheels' architecture lists (the torch entries' other sources cover releases,
# Python versions and variants).
ARCH_SOURCES = ("pt_builder", "pt_build_cuda", "moi90_measured")


class GpuRules(CheckerBase):
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
            if not re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}", cc):
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
