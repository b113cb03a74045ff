"""The rules of the system cuDNN: a build gpuenv knows, built for the toolkit's CUDA, whose tarball
the cudnn role can find."""

from __future__ import annotations

from gpuenv import versions
from gpuenv.rules.base import ERROR, WARNING, CheckerBase


class CudnnRules(CheckerBase):
    # --- cuDNN -------------------------------------------------------------------------------
    def check_cudnn(self) -> None:
        declared = self.stack.cudnn
        if declared != "none" and self.stack.cuda == "none":
            self.add(
                "cudnn-without-toolkit",
                ERROR,
                f"cuDNN {declared} is declared with cuda: none",
                "the system cuDNN goes into a CUDA toolkit's tree (or beside NVIDIA's toolkit packages); "
                "with no toolkit, torch's wheels bring their own cuDNN",
                "set cudnn: none (torch's own cuDNN), or declare the CUDA toolkit to install it into",
                "pypi_cudnn",
            )
            return
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
