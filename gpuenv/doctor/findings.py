"""What doctor found, judged: each finding says what is wrong, where (the paths), why, the fix, and the
source of the fact where gpuenv's data has one. The rules are gpuenv's own (rules.driver_against for
a driver against a CUDA runtime, archcompat for kernel images, verify's loader_problems for the
loader's cache); the evidence is what doctor read and what verify observed in each environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv import archcompat, rules, versions
from gpuenv.compat import CompatData
from gpuenv.doctor import verifyrun
from gpuenv.doctor.advice import Advice, pip_install
from gpuenv.doctor.cuda import Cudnn
from gpuenv.doctor.driver import Driver, Gpu
from gpuenv.doctor.envs import SESSION_SHELL, Env, LibPath
from gpuenv.verify.base import NO_GPU
from gpuenv.verify.model import FAIL, PASS, RUN_CHECK, SKIP, WARN

ERROR, WARNING = rules.ERROR, rules.WARNING
# verify's checks that doctor judges itself (the host's, once, not per environment) or that say
# nothing without a declared stack; any other failing check of verify's is a finding as it stands.
_JUDGED = ("driver.", "host.", "cuda_tree.", "services.", "gpu.arch_coverage", "torch.cuda_available", "cudnn.")


@dataclass
class Finding(rules.Finding):
    where: list[str] = field(default_factory=list)
    env: str | None = None


def _arch_list(env: Env, data: CompatData) -> tuple[list[str], str]:
    """The environment's torch arch list as verify observed it, else as gpuenv's data has it."""
    check = verifyrun.check(env.verify, "gpu.arch_coverage") or {}
    if check.get("status") in (PASS, FAIL) and isinstance(check.get("expected"), list):
        return [str(a) for a in check["expected"]], "torch.cuda.get_arch_list() in this environment"
    if check.get("status") == SKIP and isinstance(check.get("observed"), list) and check["observed"]:
        return [str(a) for a in check["observed"]], "torch.cuda.get_arch_list() in this environment"
    series = data.torch_series(str(env.torch).split("+")[0])
    variant = series.variants.get(versions.variant_from_cuda(str(env.torch_cuda))) if series else None
    return (variant.arch_list(), f"gpuenv's data for its build ({variant.name})") if variant else ([], "")


def _fix_stack(advice: Advice, gpu: Gpu | None = None) -> dict[str, Any] | None:
    keep = advice.keeping_driver()
    if keep is not None:
        return keep
    stacks = [s for s in advice.stacks() if gpu is None or gpu.name in s.get("gpu", [])]
    return stacks[0] if stacks else None


def env_findings(  # noqa: PLR0917 - what one environment is judged against
    env: Env,
    drv: Driver,
    gpus: list[Gpu],
    session: list[LibPath],
    copies: dict[str, Cudnn],
    advice: Advice,
    data: CompatData,
) -> list[Finding]:
    found: list[Finding] = []
    run = verifyrun.check(env.verify, RUN_CHECK)
    if run and run.get("status") == FAIL:
        found.append(
            Finding(
                "torch-import",
                ERROR,
                f"{run.get('summary')}",
                str(run.get("observed"))[-400:],
                str(run.get("hint")),
                [],
                where=[env.path],
                env=env.path,
            )
        )
    driver = drv.effective
    minimum = data.toolkit_minimum_driver(env.torch_cuda) if env.torch_cuda else None
    if driver and minimum and env.torch_cuda:
        what = f"torch {env.torch} (CUDA {env.torch_cuda} runtime)"
        judged = rules.driver_against(
            data, driver[0], what, minimum, env.torch_cuda.split(".")[0], "driver-torch-cuda", "nv_rn_table3"
        )
        if judged is not None:
            fix = f"install driver {minimum} or newer (branch {versions.driver_branch(minimum)})"
            keep = advice.keeping_driver()
            if keep is not None:
                fix += (
                    f"; or keep driver {driver[0]} and put torch {keep['torch']}+{keep['torch_variant']}, which it "
                    f"runs, into this environment: {pip_install(env.python, keep, data)}"
                )
            found.append(
                Finding(
                    judged.rule,
                    judged.severity,
                    judged.message,
                    judged.why,
                    fix,
                    judged.sources,
                    where=[env.path, driver[1]],
                    env=env.path,
                )
            )
    found += _kernel_images(env, gpus, advice, data)
    found += _shadows(env, session, copies)
    found += _verify_failures(env, gpus, found)
    return found


def _kernel_images(env: Env, gpus: list[Gpu], advice: Advice, data: CompatData) -> list[Finding]:
    if not env.torch_cuda:
        return []
    check = verifyrun.check(env.verify, "gpu.arch_coverage") or {}
    arch, origin = _arch_list(env, data)
    found = []
    for gpu in gpus:
        if gpu.cc is None or not arch or check.get("status") == PASS or archcompat.runs_on(gpu.cc, arch)[0]:
            continue
        stack = _fix_stack(advice, gpu)
        fix = (
            f"put torch {stack['torch']}+{stack['torch_variant']} (from the stack below) into this environment: "
            f"{pip_install(env.python, stack, data)}"
            if stack
            else f"install a torch build with kernels for {gpu.cc} (gpuenv suggest --gpu {gpu.cc} names one)"
        )
        found.append(
            Finding(
                "gpu-torch-arch",
                ERROR,
                f"torch {env.torch} has no kernels for compute capability {gpu.cc} ({gpu.name})",
                f"its build carries {' '.join(arch)} ({origin}); a GPU of CC {gpu.cc} runs SASS of the same "
                "major with a lower or equal minor, or PTX of a lower or equal CC, so every kernel launch fails "
                'with "no kernel image is available for execution on the device"',
                fix,
                list(rules.ARCH_SOURCES) if origin.startswith("gpuenv") else [],
                where=[env.path],
                env=env.path,
            )
        )
    return found


def _shadows(env: Env, session: list[LibPath], copies: dict[str, Cudnn]) -> list[Finding]:
    """A directory on the environment's LD_LIBRARY_PATH with a cuDNN of the major torch loads."""
    major = versions.CudnnVersion(env.cudnn).major if env.cudnn else None
    loaded = verifyrun.check(env.verify, "cudnn.loaded_library") or {}
    refused = verifyrun.check(env.verify, "cudnn.version") or {}
    if major is None or loaded.get("status") == PASS:
        return []  # verify saw torch map its own cuDNN with this LD_LIBRARY_PATH: nothing shadows it
    found = []
    own = copies[env.cudnn_lib].lib if env.cudnn_lib in copies else env.cudnn_lib
    for lp in [*env.lib_paths, *session]:
        for directory in lp.dirs:
            copy = copies.get(directory)
            if copy is None or copy.major != major or copy.lib == own:
                continue
            seen = [str(p) for p in loaded.get("observed") or [] if loaded.get("status") in (WARN, FAIL)]
            # torch 2.x loads libcudnn.so.N of its own wheel by path, and cuDNN then opens its parts
            # (libcudnn_ops_infer.so.8, ...) by name, which LD_LIBRARY_PATH answers: seen on a sandbox
            # host (molecule/doctor), torch 2.0.1 mapped its own libcudnn.so.8 and the tree's 8.6 parts.
            from_copy = [p for p in seen if p.startswith(copy.lib.rstrip("/") + "/")]
            mixed = bool(from_copy) and len(from_copy) < len(seen)
            if mixed:
                why = (
                    f"the loader searches LD_LIBRARY_PATH before the RUNPATH through which torch finds its own cuDNN "
                    f"({env.cudnn_from} {env.cudnn}); torch opened its own libcudnn.so.{major}, but cuDNN opens its "
                    f"parts by name and got them from {copy.lib}: verify saw torch map "
                    f"{', '.join(p for p in seen if p not in from_copy)} beside {', '.join(from_copy)}, two cuDNN "
                    "releases in one process"
                )
            else:
                why = (
                    f"the loader searches LD_LIBRARY_PATH before the RUNPATH through which torch finds its own cuDNN "
                    f"({env.cudnn_from} {env.cudnn}), so libcudnn.so.{major} comes from {copy.lib}"
                )
                if seen:
                    why += f"; verify saw torch map {', '.join(seen)}"
            if refused.get("status") == FAIL:
                why += f"; torch: {str(refused.get('observed'))[:300]}"
            where = "this shell" if lp.source == SESSION_SHELL else lp.source
            fix = (
                f"take {directory} out of LD_LIBRARY_PATH in {where} (torch brings its own cuDNN; programs that "
                "need the toolkit's libraries find them through /etc/ld.so.conf.d), or unset LD_LIBRARY_PATH "
                "before running python"
            )
            found.append(
                Finding(
                    "cudnn-shadow",
                    ERROR if seen or refused.get("status") == FAIL else WARNING,
                    f"{copy.lib} on LD_LIBRARY_PATH ({where}) holds cuDNN {copy.version or major}, which torch in "
                    f"{env.path} loads {'in part (its sub-libraries) beside' if mixed else 'instead of'} its own "
                    f"{env.cudnn}",
                    why,
                    fix,
                    ["ld_so_man"],
                    where=[lp.source, copy.lib, env.path],
                    env=env.path,
                )
            )
    return found


def _verify_failures(env: Env, gpus: list[Gpu], found: list[Finding]) -> list[Finding]:
    out = []
    for check in (env.verify or {}).get("checks", []):
        cid = str(check.get("id"))
        if check.get("status") == FAIL and cid != RUN_CHECK and not cid.startswith(_JUDGED):
            out.append(
                Finding(
                    f"verify:{cid}",
                    ERROR,
                    f"{cid}: {check.get('summary')}",
                    f"verify observed {str(check.get('observed'))[:300]}",
                    str(check.get("hint")),
                    [],
                    where=[env.path],
                    env=env.path,
                )
            )
    cuda = verifyrun.check(env.verify, "torch.cuda_available") or {}
    listed = [g for g in gpus if g.source == "nvidia-smi"]
    if env.torch_cuda and listed and cuda.get("status") == SKIP and NO_GPU in str(cuda.get("summary")) and not found:
        out.append(
            Finding(
                "torch-no-gpu",
                ERROR,
                f"torch in {env.path} sees no GPU, while nvidia-smi lists {len(listed)}",
                "torch.cuda.is_available() is False in this environment (verify's torch.cuda_available)",
                f"run {env.python} -c 'import torch; torch.cuda.init()' to see CUDA's own error, and check "
                "CUDA_VISIBLE_DEVICES and the permissions of /dev/nvidia*",
                [],
                where=[env.path],
                env=env.path,
            )
        )
    return out
