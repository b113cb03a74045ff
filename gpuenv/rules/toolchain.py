"""The rules of the CUDA toolkit, the torch build and its Python, and the driver both need."""

from __future__ import annotations

from gpuenv import versions
from gpuenv.compat import CompatData
from gpuenv.rules.base import ERROR, WARNING, CheckerBase, Finding


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


class ToolchainRules(CheckerBase):
    # --- CUDA toolkit and torch --------------------------------------------------------------
    def check_toolkit(self) -> None:
        if self.stack.cuda == "none":  # no system toolkit: torch's own CUDA runtime is all there is
            return
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
        # Without a toolkit, the build `pip install torch` brings: PyPI's default wheel.
        derived = (
            series.pypi_default if stack.cuda == "none" else versions.variant_from_cuda(self.toolkit or stack.cuda)
        )
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
