"""torch and its cuDNN: the declared build imports, sees CUDA, has kernels for every GPU, and loads
the cuDNN its build ships, from its own environment."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from gpuenv import archcompat
from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify.base import Checks, Context, Spec
from gpuenv.verify.model import Check

CHECKS = Checks()


def cudnn_int(version: str) -> int:
    """9.1.0(.70) -> 90100, as torch.backends.cudnn.version() reports cuDNN 9 (8.9.7 -> 8907)."""
    parts = [int(p) for p in version.split(".")[:3]]
    major, minor, patch = [*parts, 0, 0][:3]
    return major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch


def _cc(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def environment_kind(prefix: str) -> str:
    """conda (a prefix with conda-meta/), venv (pyvenv.cfg), or system."""
    if os.path.isdir(os.path.join(prefix, "conda-meta")):
        return "conda"
    return "venv" if os.path.isfile(os.path.join(prefix, "pyvenv.cfg")) else "system"


def _cuda_matches(found: str | None, want: str, env: str) -> bool:
    """torch's CUDA against the declared build's: the same, or in a conda environment the same
    major and at least that minor (conda-forge builds pytorch for a few CUDA minors, and the
    conda backend asks for cuda-version >=X.Y,<X+1)."""
    if want in ("unset", found):
        return True
    if env != "conda" or not found or not want:
        return False
    (fmaj, _, fmin), (wmaj, _, wmin) = found.partition("."), str(want).partition(".")
    return fmaj == wmaj and fmin.isdigit() and wmin.isdigit() and int(fmin) >= int(wmin)


@CHECKS.add("torch.build", "torch build")
def build(ctx: Context, me: Spec) -> Check:
    t = ctx.torch
    env = environment_kind(sys.prefix)
    observed = {"torch": t.__version__, "cuda": t.version.cuda, "env": env}
    want_torch, want_cuda = ctx.expect.get("torch"), ctx.expect.get("torch_cuda", "unset")
    if want_torch is None:
        return me.passed(f"torch {t.__version__} (CUDA {t.version.cuda}) imports; no stack to compare", observed)
    expected = {"torch": want_torch, "cuda": want_cuda}
    if t.__version__.split("+")[0] == want_torch and _cuda_matches(t.version.cuda, want_cuda, env):
        return me.passed(f"torch {t.__version__} (CUDA {t.version.cuda}, {env}) as declared", observed, expected)
    return me.failed(
        f"torch {t.__version__} (CUDA {t.version.cuda}) is not the declared build",
        observed=observed,
        expected=expected,
        hint="rebuild the environment (pytorch_env) or activate the one gpuenv built",
    )


# What an environment's users import beside torch, in the order the report names them.
COMPANIONS = ("torchvision", "torchaudio", "numpy")


@CHECKS.add("torch.companions", "torchvision, torchaudio and numpy")
def companions(ctx: Context, me: Spec) -> Check:
    """The companions the environment was built with import at their declared versions, and do work
    on the CPU device with this torch: numpy through torch's bridge (a torch without numpy support
    only warns at import), a torchvision transform and operator (its C++ extension), a torchaudio
    resample, and a convolution."""
    declared = ctx.env_record.get("companions") or {}
    declared = {str(k): str(v) for k, v in declared.items()} if isinstance(declared, dict) else {}
    found: dict[str, str] = {}
    modules: dict[str, Any] = {}
    problems: list[str] = []
    for name in COMPANIONS:
        try:
            modules[name] = importlib.import_module(name)
        except ImportError as exc:
            if name in declared:
                problems.append(f"{name} does not import ({exc})")
            continue
        except Exception as exc:  # a broken install raises anything at import
            problems.append(f"{name} fails at import ({type(exc).__name__}: {exc})")
            continue
        found[name] = str(getattr(modules[name], "__version__", "?"))
    for name, want in declared.items():
        if name in found and found[name].split("+")[0] != want:
            problems.append(f"{name} {found[name]} where the environment declares {want}")
    if not found and not declared:
        return me.skipped("the environment has none of torchvision, torchaudio or numpy", {})
    if not problems:
        problems = _exercise(ctx.torch, modules)
    observed = {"packages": ", ".join(f"{n} {v}" for n, v in found.items())}
    order = [*[n for n in COMPANIONS if n in declared], *sorted(set(declared) - set(COMPANIONS))]
    expected = {"packages": ", ".join(f"{n} {declared[n]}" for n in order)} if declared else None
    if problems:
        return me.failed(
            "; ".join(problems),
            observed=observed,
            expected=expected,
            hint="rebuild the environment: ansible-playbook playbooks/site.yml --limit <host> (stage pytorch_env)",
        )
    return me.passed(f"{observed['packages']} import and run on the CPU", observed, expected)


def _exercise(torch: Any, modules: dict[str, Any]) -> list[str]:
    """Each present companion's smallest real use on the CPU device; what failed, by name."""
    problems = []
    cpu = torch.device("cpu")
    image = torch.rand(1, 3, 16, 16, device=cpu)
    try:
        out = torch.nn.functional.conv2d(image, torch.ones(2, 3, 3, 3, device=cpu))
        if tuple(out.shape) != (1, 2, 14, 14):
            problems.append(f"a 3x3 convolution gave shape {tuple(out.shape)}, not (1, 2, 14, 14)")
    except Exception as exc:
        problems.append(f"a convolution on the CPU failed ({type(exc).__name__}: {exc})")
    if "numpy" in modules:
        try:
            total = float(torch.from_numpy(modules["numpy"].arange(6, dtype="float32")).sum())
            if total != 15.0:
                problems.append(f"numpy through torch summed 0..5 to {total}")
        except Exception as exc:
            problems.append(f"torch cannot use numpy ({type(exc).__name__}: {exc})")
    if "torchvision" in modules:
        tv = modules["torchvision"]
        try:
            resized = tv.transforms.functional.resize(image[0], [8, 8], antialias=True)
            boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 4.0, 4.1], [8.0, 8.0, 9.0, 9.0]])
            kept = tv.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()
            if tuple(resized.shape) != (3, 8, 8) or kept != [0, 2]:
                problems.append(f"torchvision's resize gave {tuple(resized.shape)} and nms kept {kept}")
        except Exception as exc:
            problems.append(f"torchvision's transform or nms failed ({type(exc).__name__}: {exc})")
    if "torchaudio" in modules:
        try:
            wave = modules["torchaudio"].functional.resample(torch.rand(1, 1600), 16000, 8000)
            if tuple(wave.shape) != (1, 800):
                problems.append(f"torchaudio resampled 1600 samples to {tuple(wave.shape)}, not (1, 800)")
        except Exception as exc:
            problems.append(f"torchaudio's resample failed ({type(exc).__name__}: {exc})")
    return problems


@CHECKS.add("torch.cuda_available", "torch sees CUDA")
def cuda_available(ctx: Context, me: Spec) -> Check:
    t = ctx.torch
    if t.version.cuda is None:
        return ctx.gpu_skip(me, "this torch is a CPU build")
    if not ctx.gpu_visible:
        return ctx.gpu_skip(me)
    count = t.cuda.device_count()
    devices = [
        {"index": i, "name": t.cuda.get_device_name(i), "cc": _cc(t.cuda.get_device_capability(i))}
        for i in range(count)
    ]
    return me.passed(f"{count} CUDA device(s)", devices)


@CHECKS.add("gpu.arch_coverage", "kernel images")
def arch_coverage(ctx: Context, me: Spec) -> Check:
    t = ctx.torch
    arch_list = list(t.cuda.get_arch_list()) if t.version.cuda else []
    if not arch_list:
        return me.skipped("this torch carries no CUDA kernels")
    if not ctx.gpu_visible:
        # The arch list as observed: gpuenv doctor judges it against the GPUs nvidia-smi names.
        return ctx.gpu_skip(
            me, title=f"kernel images for the GPUs (build has {' '.join(arch_list)})", observed=arch_list
        )
    missing, how = [], []
    for i in range(t.cuda.device_count()):
        cc = _cc(t.cuda.get_device_capability(i))
        ok, why = archcompat.runs_on(cc, arch_list)
        how.append(f"GPU {i} (CC {cc}): {why}")
        if not ok:
            missing.append(cc)
    if missing:
        return me.failed(
            f"no kernel image for CC {', '.join(missing)}",
            observed=how,
            expected=arch_list,
            hint='"no kernel image is available for execution on the device": use a '
            "torch build whose arch list covers these GPUs (gpuenv check-spec --gpu names one)",
        )
    return me.passed("every GPU has a kernel image", how, arch_list)


@CHECKS.add("cudnn.version", "cuDNN")
def cudnn_version(ctx: Context, me: Spec) -> Check:
    t = ctx.torch
    if t.version.cuda is None:
        return me.skipped("this torch is a CPU build")
    want = ctx.expect.get("torch_cudnn")
    try:
        observed = t.backends.cudnn.version()
    except RuntimeError as exc:  # torch's own refusal: "cuDNN version incompatibility ... LD_LIBRARY_PATH ..."
        return me.failed(
            "torch refuses the cuDNN it loaded",
            observed=str(exc)[:600],
            expected=cudnn_int(want) if want else None,
            hint="another cuDNN was loaded before torch's own: unset LD_LIBRARY_PATH (or take the CUDA tree out of "
            "it); see cudnn.loaded_library for the file",
        )
    enabled = bool(t.backends.cudnn.enabled)
    if observed is None:
        return me.failed(
            "torch loads no cuDNN",
            expected=want,
            hint="torch's cuDNN wheel (nvidia-cudnn-cu*) is missing or unloadable; rebuild the environment",
        )
    if want is None:
        return me.passed(f"cuDNN {observed} (enabled: {enabled}); no stack to compare", observed)
    if observed == cudnn_int(want) and enabled:
        return me.passed(f"cuDNN {observed}, as torch's build ships ({want})", observed, cudnn_int(want))
    return me.failed(
        f"cuDNN {observed} (enabled: {enabled}), not {want}",
        observed=observed,
        expected=cudnn_int(want),
        hint="another cuDNN was loaded first: look for LD_LIBRARY_PATH, and at cudnn.loaded_library",
    )


@CHECKS.add("cudnn.loaded_library", "loaded libcudnn")
def loaded_library(ctx: Context, me: Spec) -> Check:
    t = ctx.torch
    if t.version.cuda is None:
        return me.skipped("this torch is a CPU build")
    ctx.load_cudnn()
    maps = (ctx.proc / "self/maps").read_text() if (ctx.proc / "self/maps").exists() else ""
    paths = hostparse.libcudnn_paths(maps)
    if not paths:
        return me.skipped("torch has not mapped libcudnn yet", [])
    # torch's own cuDNN: a wheel's beside torch in site-packages, a conda package's in the
    # environment's lib/ (conda's pytorch depends on the channel's cudnn); both are under the prefix.
    torch_dir = Path(t.__file__).resolve().parent.parent
    roots = (str(torch_dir), str(Path(ctx.prefix).resolve()))
    if any(not p.startswith(roots) for p in paths):
        return me.warned(
            "a cuDNN outside torch's environment is loaded",
            observed=paths,
            expected=f"under {' or '.join(dict.fromkeys(roots))}",
            hint="a system cuDNN shadows torch's own: unset LD_LIBRARY_PATH (or remove the CUDA tree from it)",
        )
    return me.passed(f"libcudnn from torch's environment ({paths[0]})", paths)
