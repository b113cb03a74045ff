"""The fault x repair matrix: every way a provisioned host can drift that verify, drift.yml or the
converged stamp can see, what gpuenv promises for it, and how test_5_repair.py injects and proves
it. docs/reliability.md has it as a table ("Running it again repairs what verify finds"), which
tests/test_repair_matrix.py keeps in step with the rows here.

Rows on one host are injected together, so each row changes what no other row of its host reads;
a host's rows run twice, with the converged stamp in place (as a user reruns) and without it."""

from __future__ import annotations

from dataclasses import dataclass

# What drift.yml reads from the stamp of the last complete run: a row seen only there is not seen
# when the stamp is gone (the second round), and site.yml then runs every stage anyway.
STAMP = "drift.since_last_run"
CUDNN8_LIB = "/usr/local/cuda/lib64/libcudnn_cnn_infer.so.8.6.0"
# The environment's store directory, as its record names it.
ENV_DIR = "$(readlink -f /opt/gpuenv/envs/default)"
# Readable by an account that is not root and in no group (a member reads the tree as others do).
AS_NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups"


@dataclass(frozen=True)
class Row:
    """One fault: its key (the table's test column), what it is, the host it is injected on and the
    shell that injects it; the checks that flag it (verify's, drift's, STAMP); what repairs it; and
    a shell that exits 0 once it is repaired (for a refused row, the user's own fix, after which
    site.yml passes again)."""

    key: str
    fault: str
    host: str
    inject: str
    detected_by: tuple[str, ...]
    repaired_by: str
    proof: str
    promise: str = "repair"


ROWS = [
    # sb1: CUDA 11.8 and cuDNN 8.6 in the tree (the recipe's stack), after test_4_faults.
    Row(
        "loader-entry-removed",
        "the loader's entry for the CUDA tree removed (`rm /etc/ld.so.conf.d/*cuda*; ldconfig`)",
        "sb1",
        "rm -f /etc/ld.so.conf.d/*cuda*; ldconfig",
        ("cuda_tree.cudnn_loader", STAMP),
        "cuda_toolkit (environment.yml writes the entry back) before cudnn checks the loader (finish.yml)",
        "ldconfig -p | grep -q 'libcudnn.so.8 .*=> /usr/local/cuda/lib64/libcudnn.so.8$'",
    ),
    Row(
        "cudnn-library-mode",
        "the recipe's `chmod a+r` undone: a cuDNN library set to `chmod 600`",
        "sb1",
        f"chmod 600 {CUDNN8_LIB}",
        ("cuda_tree.cudnn_readable", STAMP),
        "cuda_toolkit and cudnn (gpuenv_cuda_tree sees the mode against the tree's record and rebuilds the tree)",
        f"{AS_NOBODY} head -c 4 {CUDNN8_LIB} >/dev/null",
    ),
    Row(
        "record-edited",
        "a record edited by hand (`/etc/ansible/facts.d/cudnn.fact`)",
        "sb1",
        "sed -i 's/8.6.0.163/8.6.0.0/' /etc/ansible/facts.d/cudnn.fact",
        ("drift.cudnn", STAMP),
        "cudnn (its record, written again by finish.yml)",
        'grep -q \'"version": "8.6.0.163"\' /etc/ansible/facts.d/cudnn.fact',
    ),
    Row(
        "profile-scripts-removed",
        "`/etc/profile.d/gpuenv-*` removed",
        "sb1",
        "rm -f /etc/profile.d/gpuenv-*",
        (STAMP,),
        "cuda_toolkit (gpuenv-cuda.sh) and pytorch_env (gpuenv-env-default.sh)",
        "test -f /etc/profile.d/gpuenv-cuda.sh && test -f /etc/profile.d/gpuenv-env-default.sh",
    ),
    # sb2: CUDA 11.8 without cuDNN, the persistence daemon on (its host_vars).
    Row(
        "env-package-added",
        "a package `pip install`ed into the shared environment by root, and one uninstalled",
        "sb2",
        "/opt/gpuenv/envs/default/bin/python -m pip install -q --disable-pip-version-check --index-url "
        '"$PYPI" --trusted-host "$PYPI_HOST" packaging && '
        "/opt/gpuenv/envs/default/bin/python -m pip uninstall -q -y einops",
        ("drift.env_packages", STAMP),
        "pytorch_env (repair.yml: what the lock lacks uninstalled, what it holds installed, hashes checked)",
        "! /opt/gpuenv/envs/default/bin/python -c 'import packaging' 2>/dev/null && "
        "/opt/gpuenv/envs/default/bin/python -c 'import einops'",
    ),
    Row(
        "env-group-mode",
        "the environment's group or mode changed",
        "sb2",
        f"chgrp root {ENV_DIR} && chmod 755 {ENV_DIR}",
        (STAMP,),
        "pytorch_env (switch.yml keeps the directory root:gpuenv 0750)",
        f"test \"$(stat -c '%G %a' {ENV_DIR})\" = 'gpuenv 750'",
    ),
    Row(
        "driver-unheld",
        "the driver's packages unheld (`apt-mark unhold`)",
        "sb2",
        "apt-mark unhold libcuda1 nvidia-smi >/dev/null",
        (STAMP,),
        "nvidia_driver (holds its packages again)",
        "apt-mark showhold | grep -qx libcuda1 && apt-mark showhold | grep -qx nvidia-smi",
    ),
    Row(
        "apt-pin-removed",
        "the apt pin file removed",
        "sb2",
        "rm /etc/apt/preferences.d/gpuenv-nvidia-driver",
        (STAMP,),
        "nvidia_driver (gpuenv_apt_pin)",
        "grep -q '^Pin: version 535' /etc/apt/preferences.d/gpuenv-nvidia-driver",
    ),
    Row(
        "nouveau-blacklist-removed",
        "the nouveau blacklist removed",
        "sb2",
        "rm /etc/modprobe.d/gpuenv-blacklist-nouveau.conf",
        (STAMP,),
        "nvidia_driver",
        "grep -q '^blacklist nouveau' /etc/modprobe.d/gpuenv-blacklist-nouveau.conf",
    ),
    Row(
        "persistenced-disabled",
        "the persistence daemon disabled",
        "sb2",
        "systemctl disable --quiet nvidia-persistenced",
        # drift.persistenced reads the unit's enabled state from systemd, whatever its last start
        # did (the sandbox's daemon fails at every boot: no GPU).
        ("drift.persistenced", STAMP),
        "gpu_services",
        "systemctl is-enabled --quiet nvidia-persistenced",
    ),
    Row(
        "default-toolkit-link",
        "`/usr/local/cuda` pointed elsewhere",
        "sb2",
        "ln -sfn /opt/gpuenv /usr/local/cuda",
        ("cuda_tree.toolkit", "drift.cuda_default", STAMP),
        "cuda_toolkit (environment.yml)",
        'test "$(readlink /usr/local/cuda)" = /usr/local/cuda-11.8',
    ),
    # sb3: CUDA 12.4 and cuDNN 9.1, upgraded from stack A (its environment is kept).
    Row(
        "toolkit-link-without-cudnn",
        "`/usr/local/cuda-X.Y` pointed at the toolkit's tree without its cuDNN",
        "sb3",
        "ln -sfn \"$(python3 -c \"import json; print(json.load(open('/usr/local/cuda-12.4/.gpuenv-cudnn.json'))"
        "['base'])\")\" /usr/local/cuda-12.4",
        ("cuda_tree.cudnn", STAMP),
        "cuda_toolkit (gpuenv_cuda_tree carries the tree's cuDNN) and cudnn",
        "test -f /usr/local/cuda-12.4/include/cudnn_version.h",
    ),
    Row(
        "env-link-older-store",
        "the environment's link pointed at an older store",
        "sb3",
        'ln -sfn "$(ls -d /opt/gpuenv/envs/.store/default-* | grep -vx "$(readlink /opt/gpuenv/envs/default)" '
        '| head -1)" /opt/gpuenv/envs/default',
        ("drift.env_active", STAMP),
        "pytorch_env (switch.yml)",
        "/opt/gpuenv/envs/default/bin/python -c 'import einops, six'",
    ),
    Row(
        "stack-record-edited",
        "the stack record edited by hand (`/etc/gpuenv/stack.json`)",
        "sb3",
        'sed -i \'s/"cuda": "12.4.1"/"cuda": "12.1.1"/\' /etc/gpuenv/stack.json',
        # verify checks the host against the edited record; drift compares it with the inventory's
        ("cuda_tree.toolkit", "drift.record", STAMP),
        "stack_record (the host's one record of its stack, which verify reads)",
        'grep -q \'"cuda": "12.4.1"\' /etc/gpuenv/stack.json',
    ),
    # sb4: CUDA 12.4 and cuDNN 9.1.
    Row(
        "cudnn-copied-by-hand",
        "a second cuDNN copied into the default tree by hand, as the recipe does "
        "(`cp cudnn*.h .../include; cp -P libcudnn* .../lib64; chmod a+r`)",
        "sb4",
        "mkdir -p /tmp/cudnn-8/include /tmp/cudnn-8/lib64 && "
        "printf '#define CUDNN_MAJOR 8\\n#define CUDNN_MINOR 9\\n#define CUDNN_PATCHLEVEL 7\\n/* 8.9.7 */\\n' "
        "> /tmp/cudnn-8/include/cudnn_version.h && "
        "head -c 4096 /dev/urandom > /tmp/cudnn-8/lib64/libcudnn.so.8.9.7 && "
        "ln -sf libcudnn.so.8.9.7 /tmp/cudnn-8/lib64/libcudnn.so.8 && "
        "cp /tmp/cudnn-8/include/cudnn*.h /usr/local/cuda/include && "
        "cp -P /tmp/cudnn-8/lib64/libcudnn* /usr/local/cuda/lib64 && "
        "chmod a+r /usr/local/cuda/include/cudnn*.h /usr/local/cuda/lib64/libcudnn*",
        ("cuda_tree.cudnn", STAMP),
        "cuda_toolkit and cudnn (the tree rebuilt; its unpacked copy, written over through the hard links, "
        "unpacked again from the tarball)",
        "grep -q '^#define CUDNN_MAJOR 9' /usr/local/cuda/include/cudnn_version.h && "
        "! ls /usr/local/cuda/lib64/libcudnn.so.8* 2>/dev/null",
    ),
    Row(
        "cudnn-file-deleted",
        "a cuDNN header and a library deleted",
        "sb4",
        "rm /usr/local/cuda/include/cudnn_backend.h /usr/local/cuda/lib64/libcudnn_graph.so.9.1.0",
        ("cuda_tree.cudnn_loader", STAMP),
        "cuda_toolkit and cudnn (the tree rebuilt from the unpacked copy)",
        "test -f /usr/local/cuda/include/cudnn_backend.h && test -f /usr/local/cuda/lib64/libcudnn_graph.so.9.1.0",
    ),
    # Refused: gpuenv leaves files it did not write alone, and says which directory comes first.
    Row(
        "another-cudnn-first",
        "another cuDNN put first in the loader's path (a file in /etc/ld.so.conf.d)",
        "sb3",
        "mkdir -p /opt/other-cudnn/lib && cp /usr/local/cuda/lib64/libcudnn.so.9.1.0 /opt/other-cudnn/lib/ && "
        "ln -sf libcudnn.so.9.1.0 /opt/other-cudnn/lib/libcudnn.so.9 && "
        "echo /opt/other-cudnn/lib > /etc/ld.so.conf.d/00-other-cudnn.conf && ldconfig",
        ("cuda_tree.cudnn_loader", STAMP),
        "refused by cudnn (finish.yml): the message names the directory that comes first",
        "rm -rf /etc/ld.so.conf.d/00-other-cudnn.conf /opt/other-cudnn && ldconfig",
        promise="refuse",
    ),
]
