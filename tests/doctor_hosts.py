"""Fake host trees for gpuenv doctor's tests: a directory laid out as a host's file system, and a runner
that answers doctor's commands with saved real output (tests/data/doctor/, README there).

The two hosts of the issue are built step by step as people build them: `messy` (Debian 13 set up by
hand: Debian's driver and nvidia-cuda-toolkit, a CUDA 11.8 redist tree, cuDNN 8.6 copied into it
after ldconfig ran, two venvs) and `clean` (what gpuenv's site.yml leaves). Their loader caches are
real `ldconfig -p` output: `python -m tests.doctor_hosts DIR` builds each host with real ELF
stand-ins (gcc, each library with its real soname), runs ldconfig -r over it where the admin ran
ldconfig, and writes what `ldconfig -r ROOT -p` prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuenv.compat import load
from gpuenv.doctor import report as doctor_report
from gpuenv.doctor.host import Host
from gpuenv.doctor.run import Options, examine
from gpuenv.verify.model import Check, to_report

DATA = Path(__file__).parent / "data" / "doctor"
TESTDATA = Path(__file__).parent / "data"
Answer = subprocess.CompletedProcess[str] | Callable[[Sequence[str], Mapping[str, str] | None], Any]
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
CUDNN8 = ["adv_infer", "adv_train", "cnn_infer", "cnn_train", "ops_infer", "ops_train"]
CUDNN9 = ["adv", "cnn", "engines_precompiled", "engines_runtime_compiled", "graph", "heuristic", "ops"]
NVIDIA_MODULES = (
    "nvidia_uvm 1540096 0 - Live 0x0000000000000000 (POE)\n"
    "nvidia 54231040 1 nvidia_uvm, Live 0x0000000000000000 (POE)\n"
)
# The head of the activate script Python's venv writes.
ACTIVATE = (
    '# This file must be used with "source bin/activate" *from bash*\n'
    'VIRTUAL_ENV="{prefix}"\nexport VIRTUAL_ENV\n'
    '_OLD_VIRTUAL_PATH="$PATH"\nPATH="$VIRTUAL_ENV/bin:$PATH"\nexport PATH\n'
)
# What roles/cuda_toolkit and roles/pytorch_env write into /etc/profile.d (their templates, rendered).
PROFILE_CUDA = (
    'case ":${PATH}:" in\n  *:/usr/local/cuda/bin:*) ;;\n'
    '  *) PATH="/usr/local/cuda/bin:${PATH}"; export PATH ;;\nesac\n'
)
PROFILE_ENV = (
    "if id -nG 2>/dev/null | tr ' ' '\\n' | grep -qx 'gpuenv'; then\n"
    '  case ":${PATH}:" in\n    *:/opt/gpuenv/envs/default/bin:*) ;;\n'
    '    *) PATH="/opt/gpuenv/envs/default/bin:${PATH}"; export PATH ;;\n  esac\n'
    "  VIRTUAL_ENV=/opt/gpuenv/envs/default; export VIRTUAL_ENV\nfi\n"
)
# The arch lists torch 2.0.1+cu117 and 2.5.1+cu124 report (gpuenv's data for those builds).
ARCH_CU117 = ["sm_37", "sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"]
ARCH_CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
WHEEL_LIB = "site-packages/nvidia/cudnn/lib"
TREE_LIB = "/usr/local/cuda-11.8/lib64"
TRAIN, LEGACY = "/home/alice/venvs/train", "/home/alice/projects/legacy/.venv"
# What /proc/self/maps shows torch 2.0.1 mapped with the tree on LD_LIBRARY_PATH (the real files,
# links resolved), as on a sandbox host set up the same way (molecule/doctor): its own
# libcudnn.so.8, loaded by path, and the tree's parts, which cuDNN opens by name.
MAPPED_BY_LEGACY = [
    f"{LEGACY}/lib/python3.11/{WHEEL_LIB}/libcudnn.so.8",
    f"{TREE_LIB}/libcudnn_ops_infer.so.8.6.0",
]
# A torch that opens libcudnn.so.8 by its name alone gets all of it from the tree.
MAPPED_WHOLE_BY_LEGACY = [f"{TREE_LIB}/libcudnn.so.8.6.0", f"{TREE_LIB}/libcudnn_ops_infer.so.8.6.0"]


def data(name: str) -> str:
    return (DATA / name).read_text() if (DATA / name).exists() else (TESTDATA / name).read_text()


def done(stdout: str = "", rc: int = 0, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, stdout, stderr)


class FakeHost:
    """A host tree under `root`, and the answers its commands give."""

    def __init__(self, root: Path, *, elf: bool = False) -> None:
        self.root, self.elf = root, elf
        self.answers: dict[tuple[str, str], Answer] = {}
        self.calls: list[tuple[list[str], Mapping[str, str] | None]] = []
        root.mkdir(parents=True, exist_ok=True)

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def inside(self, path: str) -> str:
        """The host path a link in the tree leads to (an absolute target is the host's, never this machine's)."""
        for _ in range(40):
            if not self.path(path).is_symlink():
                return path
            target = os.readlink(self.path(path))
            path = target if target.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(path), target))
        raise AssertionError(f"{path}: links loop")

    def write(self, path: str, text: str = "", mode: int = 0o644) -> None:
        target = self.path(self.inside(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def link(self, path: str, to: str) -> None:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(to)

    def library(self, path: str, soname: str | None = None, links: Sequence[str] = ()) -> None:
        """A shared library (an ELF stand-in with its soname when building the real caches), with
        links to it by name in the same directory."""
        if self.elf:
            self.path(path).parent.mkdir(parents=True, exist_ok=True)
            source = self.root.parent / "stub.c"
            source.write_text("int gpuenv_doctor_stub;\n")
            soname = soname or Path(path).name
            argv = ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(self.path(path)), str(source)]
            subprocess.run(argv, check=True)
        else:
            self.write(path, f"ELF stand-in for {soname or Path(path).name}\n")
        for name in links:
            self.link(str(Path(path).parent / name), Path(path).name)

    def tool(self, path: str, *answers: tuple[str, Answer]) -> None:
        """An executable, and what it prints for each first argument ("*": any)."""
        if not self.path(self.inside(path)).exists():
            self.write(path, "#!/bin/sh\nexit 0\n", 0o755)
        for first, answer in answers:
            self.answers[(path, first)] = answer

    def forget(self, path: str) -> None:
        """Drop every answer of a command (a test gives it others)."""
        self.answers = {k: v for k, v in self.answers.items() if k[0] != path}

    def ldconfig_ran(self) -> None:
        """Where the admin ran ldconfig: the generator builds the cache here."""
        if self.elf:
            subprocess.run(["ldconfig", "-r", str(self.root)], check=True)  # noqa: S607

    def runner(
        self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str] | None:
        self.calls.append((list(argv), env))
        first = argv[1] if len(argv) > 1 else ""
        names = [argv[0], Host(root=self.root).real(argv[0]) or argv[0]]  # a command is answered by any path to it
        found_ = [self.answers.get((n, k)) for n in names for k in (first, "*")]
        answer = next((a for a in found_ if a is not None), None)
        if answer is None:
            raise AssertionError(f"the fake host has no answer for {list(argv)}")
        found = answer if isinstance(answer, subprocess.CompletedProcess) else answer(argv, env)
        return subprocess.CompletedProcess(list(argv), found.returncode, found.stdout, found.stderr)

    def host(self, *, home: str = "/home/alice", uid: int = 1000, environ: Mapping[str, str] | None = None) -> Host:
        env = {"HOME": home, "PATH": "/usr/local/bin:/usr/bin:/bin", **(environ or {})}
        return Host(root=self.root, runner=self.runner, environ=env, uid=uid)

    def verify_calls(self) -> dict[str, Mapping[str, str] | None]:
        """The environments verify ran in (their Python), with the environment it ran with."""
        return {argv[0]: env for argv, env in self.calls if len(argv) > 2 and argv[2] == "--json"}


# --- building blocks -----------------------------------------------------------------------------
def debian(fh: FakeHost, release: str, ldconfig: str, dpkg: str | None) -> None:
    fh.write("/etc/os-release", data(f"os-release-debian{release}"))
    fh.write("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n\n")
    fh.write(
        "/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
        f"# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n{MULTIARCH}\n",
    )
    fh.link("/lib", "usr/lib")
    fh.tool("/usr/sbin/ldconfig", ("-p", lambda argv, env: done(data(ldconfig))))  # read late: the generator writes it
    fh.tool("/usr/sbin/modinfo", ("*", done("", 1, "modinfo: ERROR: Module nvidia not found.\n")))
    if dpkg is not None:
        fh.tool("/usr/bin/dpkg-query", ("-W", done(data(dpkg), 1, "dpkg-query: no packages found matching cuda-*\n")))
    fh.write("/proc/modules", "ext4 1044480 1 - Live 0x0000000000000000\n")
    fh.path("/home/alice").mkdir(parents=True, exist_ok=True)


def debian_driver(fh: FakeHost, version: str, *, loaded: bool, gpus: str = "NVIDIA A10, 8.6\n") -> None:
    """Debian's driver packages: the libraries under nvidia/current behind the alternatives' links,
    nvidia-smi, and (loaded) the module's /proc file and its lines in /proc/modules."""
    for name in ("libcuda", "libnvidia-ml"):
        real = f"{MULTIARCH}/nvidia/current/{name}.so.{version}"
        fh.library(real, f"{name}.so.1", links=[f"{name}.so.1", f"{name}.so"])
        fh.link(f"/etc/alternatives/{name}.so.1-x86_64-linux-gnu", f"{MULTIARCH}/nvidia/current/{name}.so.1")
        fh.link(f"{MULTIARCH}/{name}.so.1", f"/etc/alternatives/{name}.so.1-x86_64-linux-gnu")
    fh.link("/etc/alternatives/nvidia--nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi")
    fh.link("/usr/bin/nvidia-smi", "/etc/alternatives/nvidia--nvidia-smi")
    smi = "/usr/bin/nvidia-smi"
    if loaded:
        fh.write(
            "/proc/driver/nvidia/version",
            data("proc-driver-nvidia-version-proprietary-515.txt").replace("515.76", version),
        )
        fh.write("/proc/modules", fh.path("/proc/modules").read_text() + NVIDIA_MODULES)
        fh.tool(
            smi,
            ("--query-gpu=driver_version", done(f"{version}\n" * len(gpus.splitlines()))),
            ("--query-gpu=name,compute_cap", done(gpus)),
        )
    else:
        fh.tool(smi, ("*", done(data("nvidia-smi-no-module-550.163.01.txt"), 9)))
    fh.ldconfig_ran()


def redist_tree(fh: FakeHost, tree: str, cudart: str, ptxas: str, lib: str = "lib64") -> None:
    """A CUDA tree from NVIDIA's redist archives (cudart, nvcc's ptxas), unpacked as the runfile lays it out."""
    major = cudart.split(".", maxsplit=1)[0]
    soname = f"libcudart.so.{major}.0" if major == "11" else f"libcudart.so.{major}"
    fh.library(f"{tree}/{lib}/libcudart.so.{cudart}", soname, links=[soname, "libcudart.so"])
    fh.tool(f"{tree}/bin/ptxas", ("--version", done(data(ptxas))))


def cudnn_into(fh: FakeHost, lib: str, include: str, header: str, version: str) -> None:
    """A cuDNN's libraries as NVIDIA's archives hold them (libcudnn*.so.M -> .so.M.m.p) and its header."""
    major = version.split(".", maxsplit=1)[0]
    for part in ["", *(f"_{p}" for p in (CUDNN8 if major == "8" else CUDNN9))]:
        name = f"libcudnn{part}.so"
        fh.library(f"{lib}/{name}.{version}", f"{name}.{major}", links=[f"{name}.{major}", name])
    fh.write(f"{include}/cudnn_version.h", data(header))


def venv(
    fh: FakeHost,
    prefix: str,
    torch: str,
    cudnn: tuple[str, str] | None,
    activate_extra: str = "",
    python: str = "3.11",
    home: str = "/home/alice/.local/share/uv/python/cpython-3.11.13-linux-x86_64-gnu/bin",
) -> None:
    """A venv with torch and its cuDNN wheel laid out as PyPI's wheels are (by default Python 3.11 from uv)."""
    site = f"{prefix}/lib/python{python}/site-packages"
    fh.write(f"{prefix}/pyvenv.cfg", f"home = {home}\ninclude-system-site-packages = false\nversion = {python}\n")
    fh.write(
        f"{prefix}/bin/activate",
        ACTIVATE.format(prefix=prefix) + activate_extra,
    )
    fh.tool(f"{prefix}/bin/python")
    fh.write(f"{site}/torch/version.py", data(f"torch-version-{torch}.txt"))
    if cudnn:
        wheel, version = cudnn
        fh.write(
            f"{site}/{wheel.replace('-', '_')}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {wheel}\nVersion: {version}\n",
        )
        major = version.split(".")[0]
        for part in ["", *(f"_{p}" for p in (CUDNN8 if major == "8" else CUDNN9))]:
            fh.write(f"{site}/nvidia/cudnn/lib/libcudnn{part}.so.{major}", "ELF stand-in\n")
        fh.write(f"{site}/nvidia/cudnn/include/cudnn_version.h", data(f"cudnn_version-{version}.h"))


def verify_answer(fh: FakeHost, python: str, report: dict[str, Any], rc: int | None = None) -> None:
    fh.tool(python, ("*", done(json.dumps(report), report["exit_code"] if rc is None else rc)))


def report(host: str = "alice-ws", **checks: tuple[str, Any, Any]) -> dict[str, Any]:
    """A verify report (gpuenv.verify.model) of the checks given as id=(status, observed, expected);
    ids are written with "__" for ".". These stand in for runs on a GPU host none of the sessions had."""
    made = [
        Check(
            cid.replace("__", "."),
            status,
            f"{cid} {status}",
            observed,
            expected,
            "the check's hint" if status == "fail" else None,
        )
        for cid, (status, observed, expected) in checks.items()
    ]
    return to_report(made, host)


# --- the two hosts of the issue -----------------------------------------------------------------
LEGACY_ACTIVATE = "export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}\n"


def messy(root: Path, *, elf: bool = False) -> FakeHost:
    """Debian 13 set up by hand over the years: Debian's driver (550) and nvidia-cuda-toolkit (12.4),
    CUDA 11.8 from NVIDIA's redist archives in /usr/local/cuda-11.8 (the loader told about it in
    /etc/ld.so.conf.d/cuda.conf), then cuDNN 8.6 from its .tgz copied in without ldconfig; a venv with
    PyPI's torch 2.13.0 (CUDA 13.0), and an old project's venv with torch 2.0.1 (CUDA 11.7) whose
    activate script puts /usr/local/cuda/lib64 on LD_LIBRARY_PATH, as NVIDIA's post-install steps say."""
    fh = FakeHost(root, elf=elf)
    debian(fh, "13", "ldconfig-p-messy.txt", "dpkg-query-debian13-messy.txt")
    debian_driver(fh, "550.163.01", loaded=True)
    fh.write("/usr/bin/nvcc", data("usr-bin-nvcc-debian13.sh"), 0o755)
    fh.tool("/usr/bin/nvcc", ("--version", done(data("nvcc-version-debian13-12.4.131.txt"))))
    redist_tree(fh, "/usr/local/cuda-11.8", "11.8.89", "ptxas-version-11.8.89.txt")
    fh.link("/usr/local/cuda", "cuda-11.8")
    fh.write("/etc/ld.so.conf.d/cuda.conf", "/usr/local/cuda/lib64\n")
    fh.ldconfig_ran()
    cudnn_into(fh, "/usr/local/cuda/lib64", "/usr/local/cuda/include", "cudnn_version-8.6.0.163.h", "8.6.0")
    venv(fh, TRAIN, "2.13.0+cu130", ("nvidia-cudnn-cu13", "9.20.0.48"))
    venv(fh, LEGACY, "2.0.1+cu117", ("nvidia-cudnn-cu11", "8.5.0.96"), LEGACY_ACTIVATE)
    site = "lib/python3.11/site-packages/nvidia/cudnn/lib"
    # torch 2.13.0+cu130 on driver 550: torch.cuda.is_available() is False; its arch list still reads.
    verify_answer(fh, f"{TRAIN}/bin/python", report(
        torch__build=("pass", {"torch": "2.13.0+cu130", "cuda": "13.0", "env": "venv"}, None),
        torch__cuda_available=("skip", "no CUDA device visible to torch (no GPU, or no driver loaded)", None),
        gpu__arch_coverage=("skip", ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], None),
        cudnn__version=("pass", 92000, None),
        cudnn__loaded_library=("pass", [f"{TRAIN}/{site}/libcudnn.so.9"], None),
    ))  # fmt: skip
    # torch 2.0.1 maps the tree's cuDNN 8.6 parts (LD_LIBRARY_PATH comes before its RUNPATH).
    verify_answer(fh, f"{LEGACY}/bin/python", report(
        torch__build=("pass", {"torch": "2.0.1+cu117", "cuda": "11.7", "env": "venv"}, None),
        torch__cuda_available=("pass", [{"index": 0, "name": "NVIDIA A10", "cc": "8.6"}], None),
        gpu__arch_coverage=("pass", ["GPU 0 (CC 8.6): SASS sm_86"], ARCH_CU117),
        cudnn__version=("pass", 8500, None),  # torch.backends.cudnn.version(): its own libcudnn.so.8
        cudnn__loaded_library=("warn", MAPPED_BY_LEGACY, LEGACY),
    ))  # fmt: skip
    return fh


GPUENV_TREE = "/opt/gpuenv/cuda/12.4.1-3f1c2a9e+cudnn-9.1.0.70-8b2d41c0"
GPUENV_ENV = "/opt/gpuenv/envs/.store/default-a8719af5ff02"


def clean(root: Path, *, elf: bool = False, driver: str = "550.163.01", gpus: str = "NVIDIA A10, 8.6\n") -> FakeHost:
    """Debian 13 as gpuenv's site.yml leaves it: Debian's driver 550, CUDA 12.4.1 with cuDNN 9.1.0.70
    in one tree (/usr/local/cuda -> /usr/local/cuda-12.4 -> the tree), the loader told about it in
    gpuenv-cuda.conf, and the shared environment /opt/gpuenv/envs/default (torch 2.5.1, CUDA 12.4)."""
    fh = FakeHost(root, elf=elf)
    debian(fh, "13", "ldconfig-p-clean.txt", "dpkg-query-debian13-clean.txt")
    debian_driver(fh, driver, loaded=True, gpus=gpus)
    redist_tree(fh, GPUENV_TREE, "12.4.127", "ptxas-version-12.4.131.txt", lib="lib")
    fh.link(f"{GPUENV_TREE}/lib64", "lib")
    cudnn_into(fh, f"{GPUENV_TREE}/lib", f"{GPUENV_TREE}/include", "cudnn_version-9.1.0.70.h", "9.1.0")
    fh.link("/usr/local/cuda-12.4", GPUENV_TREE)
    fh.link("/usr/local/cuda", "/usr/local/cuda-12.4")
    fh.write(
        "/etc/ld.so.conf.d/gpuenv-cuda.conf",
        "# Written by gpuenv (cuda_toolkit): the default CUDA toolkit's libraries.\n/usr/local/cuda/lib64\n",
    )
    fh.write(
        "/etc/profile.d/gpuenv-cuda.sh",
        PROFILE_CUDA,
    )
    fh.ldconfig_ran()
    venv(fh, GPUENV_ENV, "2.5.1+cu124", ("nvidia-cudnn-cu12", "9.1.0.70"), python="3.13", home="/usr/bin")
    fh.link("/opt/gpuenv/envs/default", GPUENV_ENV)
    fh.write(
        "/etc/profile.d/gpuenv-env.sh",
        PROFILE_ENV,
    )
    fh.write(
        "/etc/gpuenv/stack.json",
        json.dumps({"torch": "2.5.1", "torch_cuda": "12.4", "cuda": "12.4.1", "cudnn": "9.1.0.70"}),
    )
    verify_answer(fh, f"{GPUENV_ENV}/bin/python", report(
        torch__build=("pass", {"torch": "2.5.1+cu124", "cuda": "12.4", "env": "venv"}, None),
        torch__cuda_available=("pass", [{"index": 0, "name": "NVIDIA A10", "cc": "8.6"}], None),
        gpu__arch_coverage=("pass", ["GPU 0 (CC 8.6): SASS sm_86"], ARCH_CU124),
        cudnn__version=("pass", 90100, None),
        cudnn__loaded_library=("pass", [f"{GPUENV_ENV}/lib/python3.13/{WHEEL_LIB}/libcudnn.so.9"], None),
    ))  # fmt: skip
    return fh


def generate(dest: Path) -> None:
    """Write each host's `ldconfig -p` (real ldconfig over the host built with ELF stand-ins)."""
    for name, build in (("messy", messy), ("clean", clean)):
        with tempfile.TemporaryDirectory() as tmp:
            fh = build(Path(tmp) / "root", elf=True)
            run = subprocess.run(["ldconfig", "-r", str(fh.root), "-p"], capture_output=True, text=True, check=True)  # noqa: S607
            (dest / f"ldconfig-p-{name}.txt").write_text(run.stdout)


def show(name: str, *, as_json: bool = False) -> str:
    """What `gpuenv doctor` prints on one of the two hosts (docs/commands.md's example)."""
    with tempfile.TemporaryDirectory() as tmp:
        fh = {"messy": messy, "clean": clean}[name](Path(tmp) / "root")
        found = examine(fh.host(), load(), Options())
        return doctor_report.as_json(found, load()) if as_json else doctor_report.text(found, load())


if __name__ == "__main__":
    if sys.argv[1:2] == ["show"]:  # python -m tests.doctor_hosts show messy|clean [--json]
        print(show(sys.argv[2], as_json="--json" in sys.argv), end="")
    else:
        generate(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA)
        print(os.listdir(DATA))
