"""The roles' refusals of their settings, one sentence per setting that is wrong, each naming the
variable, what it holds and what it must be (a role's first assert joins them). Written here rather
than in a task's Jinja so that each refusal is its own tested sentence. Standard library and the
package's own value checks (gpuenv.inputs, gpuenv.redist) only."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from gpuenv import inputs, redist

_BUILD = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}")


def _shown(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def cudnn_problems(settings: Mapping[str, Any], host: str) -> list[str]:
    """The cudnn role's settings: version, cuda_major, source, cuda_trees, tarball_url,
    tarball_path, tarball_checksum, fetch (the role's variables without their cudnn_ prefix)."""
    version, major = str(settings["version"]), str(settings["cuda_major"])
    url, path = str(settings.get("tarball_url") or ""), str(settings.get("tarball_path") or "")
    checksum = str(settings.get("tarball_checksum") or "")
    found = []
    if not _BUILD.fullmatch(version):
        found.append(
            f'cudnn_version "{_shown(version, 30)}" must be a full cuDNN build such as "8.6.0.163" '
            '(the preflight resolves a declared "8.6.0" to it)'
        )
    if not re.fullmatch(r"[0-9]+", major):
        found.append(f'cudnn_cuda_major "{_shown(major, 10)}" must be the CUDA major, a number such as 12')
    if settings["source"] == "tarball" and not settings["cuda_trees"]:
        found.append(
            "cudnn_cuda_trees is empty: a stack without a CUDA toolkit has no tree for a cuDNN tarball "
            "(declare cudnn: none, or a cuda release)"
        )
    if url and path:
        found.append("cudnn_tarball_url and cudnn_tarball_path are both set: name the tarball once")
    if (url or path) and not checksum:
        found.append(
            'the tarball named by cudnn_tarball_url or cudnn_tarball_path needs cudnn_tarball_checksum "sha256:<hex>"'
        )
    if checksum and not (url or path):
        found.append(
            "cudnn_tarball_checksum is set without cudnn_tarball_url or cudnn_tarball_path, the tarball it checks"
        )
    if checksum and not _CHECKSUM.fullmatch(checksum):
        found.append(f'cudnn_tarball_checksum "{_shown(checksum, 30)}" must be "sha256:" and 64 lower-case hex digits')
    if path and not path.startswith("/"):
        found.append(f'cudnn_tarball_path "{_shown(path, 60)}" must be an absolute path on the controller')
    if settings["fetch"] != "controller" and (path or url.startswith("file://")):
        found.append("a tarball on the controller (cudnn_tarball_path, or a file:// URL) needs cudnn_fetch: controller")
    return [f"cudnn on {host}: {problem}; nothing was changed." for problem in found]


_DRIVER_VERSION = re.compile(r"[0-9]{3}(\.[0-9]{1,4}){0,2}")
_TESLA_VARIANT = re.compile(r"tesla-[0-9]{3}")


def driver_problems(settings: Mapping[str, Any], host: str) -> list[str]:
    """The nvidia_driver role's settings (its variables without the nvidia_driver_ prefix: mode,
    version, debian_variant, reboot_policy, secure_boot, repo_url, mok_key, mok_cert, download_dir)
    and what the host said of itself: `controller`, why a reboot of this host reboots the controller
    (None where it does not, or the policy never reboots); `secure_boot_on`; `resolved`, whether the
    preflight published gpu_stack_resolved (the version's usual source)."""
    found = []
    version, variant = str(settings["version"]), str(settings["debian_variant"])
    if (settings["mode"] != "none" and not _DRIVER_VERSION.fullmatch(version)) or (
        variant and not _TESLA_VARIANT.fullmatch(variant)
    ):
        sentence = (
            f'nvidia_driver on {host}: version "{_shown(version, 40)}" must be a branch ("550") or an exact version'
            f' ("550.163.01"), usually from gpu_stack.driver; and nvidia_driver_debian_variant "{_shown(variant, 20)}"'
            ' must be empty or tesla-<branch> ("tesla-535"); nothing was changed.'
        )
        if not settings["resolved"]:
            sentence += (
                " No resolved stack: the preflight role (gpu_stack) did not run in this play, and it is what checks"
                " the stack and publishes gpu_stack_resolved. Run playbooks/site.yml or playbooks/driver.yml (they"
                " run it with tag always), or set nvidia_driver_version."
            )
        found.append(sentence)
    if settings["controller"] is not None:
        found.append(
            f"nvidia_driver on {host}: nvidia_driver_reboot_policy {settings['reboot_policy']} is refused because"
            f" {settings['controller']}; a reboot would end this run. Set nvidia_driver_reboot_policy: never there"
            " and reboot by hand when the run says a reboot is needed. Nothing was changed."
        )
    if settings["secure_boot_on"] and settings["secure_boot"] != "sign" and settings["mode"] == "full":
        found.append(
            f"Secure Boot is on on {host}: the kernel would refuse an unsigned NVIDIA module and leave the host"
            " without a driver. Either enroll a machine owner key (mokutil --import, then confirm at the next boot)"
            " and set nvidia_driver_secure_boot: sign with nvidia_driver_mok_key and nvidia_driver_mok_cert pointing"
            " at it, or turn Secure Boot off in the firmware."
        )
    forms = {
        "nvidia_driver_repo_url": (settings["repo_url"], "url"),
        "nvidia_driver_mok_key": (settings["mok_key"], "abs_path"),
        "nvidia_driver_mok_cert": (settings["mok_cert"], "abs_path"),
        "nvidia_driver_download_dir": (settings["download_dir"], "abs_path"),
    }
    malformed = inputs.problems(forms)
    if malformed:
        found.append(f"nvidia_driver on {host}: {'; '.join(malformed)}; nothing was changed.")
    return found


def cudnn_manifest_problem(
    manifest: Mapping[str, Any], plan: Mapping[str, Any], settings: Mapping[str, Any]
) -> str | None:
    """Why the cudnn role cannot install from the redist manifest that answered, or None.

    manifest: what the fetch of the manifest returned (status, msg, url, content); plan: the
    tarball it names (error, archives); settings: the role's variables without the cudnn_ prefix
    (version, release, redist_url, manifest_checksum, tarball_url, tarball_path). A tarball given by
    URL or path has no manifest; the plan's checks still hold for it."""
    given = bool(settings["tarball_url"] or settings["tarball_path"])
    version, pinned = str(settings["version"]), str(settings["manifest_checksum"])
    if not given and int(manifest.get("status") or 0) != 200:
        return (
            f"Neither {settings['redist_url']}/redistrib_{settings['release']}.json nor redistrib_{version}.json can"
            f" be read ({manifest.get('msg') or 'no answer'}): check cudnn_redist_url and that the mirror has cuDNN"
            f" {version}. NVIDIA published no manifest for cuDNN up to 8.3.0 (.tgz) and names some 8.x manifests"
            " otherwise: give cudnn_tarball_url (or cudnn_tarball_path for a file on the controller) and"
            " cudnn_tarball_checksum. Nothing was installed."
        )
    if not given and pinned:
        actual = "sha256:" + hashlib.sha256(str(manifest.get("content") or "").encode()).hexdigest()
        if actual != pinned:
            return (
                f"{manifest.get('url')} has sha256 {actual.removeprefix('sha256:')}, expected {pinned}"
                " (cudnn_manifest_checksum). Nothing was installed."
            )
    archive = (plan.get("archives") or [{}])[0]
    if plan.get("error"):
        problem = str(plan["error"])
    elif archive.get("version") != version:
        problem = f"the manifest has cuDNN {archive.get('version')}, not {version}"
    elif not redist.plain_relative_path(str(archive.get("file", ""))):
        problem = f"the tarball name {_shown(archive.get('file', ''), 80)} is not a plain file name"
    else:
        return None
    return f"{problem}; nothing was installed. Check cudnn_version (gpu_stack.cudnn), cudnn_cuda_major and the mirror."


_TOOLKIT = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


def cuda_toolkit_problems(settings: Mapping[str, Any], host: str) -> list[str]:
    """The cuda_toolkit role's settings (its variables without the cuda_toolkit_ prefix: source,
    versions, default) and `stack_cuda`, the resolved stack's cuda ("none" for a stack without a
    toolkit)."""
    source, versions = str(settings["source"]), [str(v) for v in settings["versions"] or []]
    default = str(settings["default"])
    if settings["stack_cuda"] == "none" and source != "none":
        return [
            f"cuda_toolkit on {host}: the stack declares cuda: none (no system toolkit), but cuda_toolkit_source is"
            f" {source}. Remove the setting (none follows from the stack), or declare the toolkit to install in"
            " gpu_stack.cuda. Nothing was changed."
        ]
    wrong = source != "none" and (
        not versions or any(not _TOOLKIT.fullmatch(v) for v in versions) or default not in versions
    )
    # Two versions of one X.Y would share /usr/local/cuda-X.Y.
    if wrong or len({v.rsplit(".", 1)[0] for v in versions}) != len(versions):
        return [
            f'cuda_toolkit on {host}: versions {_shown(versions, 120)} must each be X.Y.Z ("12.4.1"), one per X.Y'
            f' (they share /usr/local/cuda-X.Y), and the default "{_shown(default, 20)}" must be one of them. Both'
            " come from gpu_stack.cuda unless set. Nothing was changed."
        ]
    return []
