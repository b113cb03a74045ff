"""Malformed stack files: `gpuenv check-spec` exits 2 and says what is wrong and how to fix it."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from gpuenv.checkspec import check_file

GOOD = """\
gpu_stack:
  driver: "550"
  cuda: "12.4.1"
  cudnn: "9.1.0.70"
  python: "3.11"
  torch: "2.5.1"
"""

# (id, file content or None for a missing file, words the message must contain)
MALFORMED: list[tuple[str, str | None, list[str]]] = [
    ("missing-file", None, ["no such file"]),
    ("not-yaml", "gpu_stack: [unclosed\n  driver: 550\n", ["not valid YAML"]),
    ("empty-file", "", ["no top-level 'gpu_stack' key"]),
    ("no-gpu-stack-key", "stack:\n  driver: '550'\n", ["no top-level 'gpu_stack' key"]),
    ("gpu-stack-is-a-list", "gpu_stack:\n  - driver\n", ["must be a mapping", "a list"]),
    ("unknown-key-with-suggestion", GOOD + "  cudnn_version: '9.1.0.70'\n", ["unknown key", "Did you mean 'cudnn'"]),
    ("python-as-float", GOOD.replace('python: "3.11"', "python: 3.10"), ["read as a number", "quote it"]),
    ("cuda-as-float", GOOD.replace('cuda: "12.4.1"', "cuda: 12.4"), ["read as a number"]),
    ("cuda-not-a-version", GOOD.replace('cuda: "12.4.1"', "cuda: twelve"), ["gpu_stack.cuda", "'twelve'"]),
    ("driver-too-short", GOOD.replace('driver: "550"', 'driver: "55"'), ["gpu_stack.driver", "branch"]),
    ("duplicate-key", GOOD + '  torch: "2.4.1"\n', ["appears twice", "line 6"]),
    (
        "unknown-profile",
        "gpu_stack:\n  profile: torch-2.5-cu12\n",
        ["no profile named", "Did you mean 'torch-2.5-cu124'"],
    ),
    ("missing-required", 'gpu_stack:\n  driver: "550"\n', ["missing cuda, cudnn, python, torch"]),
    ("empty-gpu-list", GOOD + "  gpu: []\n", ["list is empty"]),
    ("cudnn-null", GOOD.replace('cudnn: "9.1.0.70"', "cudnn:"), ["gpu_stack.cudnn", "write none as the word none"]),
    ("templated-value", GOOD.replace('torch: "2.5.1"', 'torch: "{{ torch_release }}"'), ["Jinja template"]),
    ("unknown-os", GOOD + "  os: windows11\n", ["gpu_stack.os", "debian12"]),
    ("torch-major-minor-only", GOOD.replace('torch: "2.5.1"', 'torch: "2.5"'), ["gpu_stack.torch"]),
    ("boolean-value", GOOD.replace('cudnn: "9.1.0.70"', "cudnn: no"), ["gpu_stack.cudnn", "a boolean"]),
    ("bad-variant", GOOD + "  torch_variant: cuda124\n", ["gpu_stack.torch_variant"]),
    ("complex-key", GOOD + "  ? [a, b]\n  : 1\n", ["a key must be a plain word", "a list"]),
    ("packages-not-a-list", GOOD + "  packages: numpy==2.3.4\n", ["gpu_stack.packages", "expected a list"]),
    ("package-unpinned", GOOD + "  packages: [numpy]\n", ["gpu_stack.packages", "'numpy'", "name==version"]),
    (
        "huge-number",
        GOOD.replace('driver: "550"', 'driver: "550.' + "9" * 5000 + '"'),
        ["gpu_stack.driver", "(5004 characters)"],
    ),
]


@pytest.mark.parametrize(("content", "words"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_stack_files_exit_2(tmp_path: Path, content: str | None, words: list[str]) -> None:
    path = tmp_path / "stack.yml"
    if content is not None:
        path.write_text(content)
    result = check_file(path)
    assert result["exit_code"] == 2
    assert result["verdict"] == "invalid"
    text = " ".join(e["message"] for e in result["errors"])
    for word in words:
        assert word in text, text


def test_a_group_vars_file_may_hold_other_variables(tmp_path: Path) -> None:
    path = tmp_path / "gpu_hosts.yml"
    path.write_text("ansible_user: admin\n" + GOOD)
    assert check_file(path)["exit_code"] == 0


def test_unquoted_integer_driver_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "stack.yml"
    path.write_text(GOOD.replace('driver: "550"', "driver: 550"))
    assert check_file(path)["stack"]["driver"] == "550"


@pytest.mark.parametrize(("content", "code"), [(GOOD, 0), (GOOD.replace('"550"', '"470"'), 1), ("nope: 1\n", 2)])
def test_cli_exit_codes_and_json(tmp_path: Path, gpuenv_cmd: list[str], content: str, code: int) -> None:
    path = tmp_path / "stack.yml"
    path.write_text(content)
    text = subprocess.run([*gpuenv_cmd, "check-spec", str(path)], capture_output=True, text=True, check=False)
    assert text.returncode == code, text.stdout + text.stderr
    assert f"exit {code})" in text.stdout
    out = subprocess.run([*gpuenv_cmd, "check-spec", "--json", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == code
    result = json.loads(out.stdout)
    assert result["exit_code"] == code
    assert result["verdict"] == ["compatible", "incompatible", "invalid"][code]


def test_cli_gpu_option_overrides_the_file(tmp_path: Path, gpuenv_cmd: list[str]) -> None:
    path = tmp_path / "stack.yml"
    path.write_text(GOOD + '  gpu: "RTX 4090"\n')
    out = subprocess.run(
        [*gpuenv_cmd, "check-spec", str(path), "--gpu", "RTX 5090"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 1
    assert "torch 2.5.1+cu124 has no kernels for compute capability 12.0 (RTX 5090)" in out.stdout


def test_cli_profiles_lists_every_profile(gpuenv_cmd: list[str]) -> None:
    out = subprocess.run([*gpuenv_cmd, "profiles", "--json"], capture_output=True, text=True, check=True)
    names = {p["name"] for p in json.loads(out.stdout)}
    assert {"torch-2.5-cu124", "torch-2.7-cu128", "debian12-stock"} <= names


def test_example_inventory_stack_is_compatible(repo: Path, gpuenv_cmd: list[str]) -> None:
    out = subprocess.run(
        [*gpuenv_cmd, "check-spec", str(repo / "inventory/example/group_vars/gpu_hosts.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize(
    ("name", "code"),
    [("rtx5090-on-torch-2.5.yml", 1), ("pascal-workstation.yml", 0), ("cuda11.3-cudnn8.2.1-torch1.12.yml", 0)],
)
def test_documented_examples_give_their_verdicts(repo: Path, name: str, code: int) -> None:
    result = check_file(repo / "docs" / "examples" / name)
    assert result["exit_code"] == code
    # The verdict the example's comment quotes is the one check-spec gives.
    text = (repo / "docs" / "examples" / name).read_text()
    if "verdict: " in text:
        assert f"exit {code})" in text.split("verdict: ", 1)[1].splitlines()[0]


def test_yaml_merge_keys_work_as_in_ansible(tmp_path: Path) -> None:
    path = tmp_path / "stack.yml"
    path.write_text(
        'base: &base\n  driver: "550"\n  cuda: "12.4.1"\n'
        'gpu_stack:\n  <<: *base\n  cudnn: none\n  python: "3.11"\n  torch: "2.5.1"\n'
    )
    assert check_file(path)["exit_code"] == 0


def test_keys_1_and_true_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "stack.yml"
    path.write_text("1: a\ntrue: b\n" + GOOD)
    assert check_file(path)["exit_code"] == 0


def test_packages_are_carried_into_the_resolved_stack(tmp_path: Path) -> None:
    path = tmp_path / "stack.yml"
    path.write_text(GOOD + '  packages: ["numpy==2.3.4", "einops==0.8.1"]\n')
    result = check_file(path)
    assert result["exit_code"] == 0
    assert result["stack"]["packages"] == ["numpy==2.3.4", "einops==0.8.1"]


# --- hostile stack files: never a traceback, a hang or a flood ---
BASE = 'cuda: "12.4.1", cudnn: none, python: "3.11", torch: "2.5.1"'


@pytest.mark.parametrize(
    ("driver", "says"),
    [
        ("0550", "0550 is read by YAML as the number 360 (a leading 0 makes it octal)"),
        ("0x226", "0x226 is read by YAML as the number 550 (0x makes it hexadecimal)"),
        ("0o1046", "'0o1046' is not a driver branch"),  # YAML 1.2's octal is a string to YAML 1.1
        ("5_50", "(YAML drops the underscores)"),
        ("9:10", "(a colon makes it base 60)"),
    ],
)
def test_integers_yaml_reads_in_another_base_are_refused(tmp_path: Path, driver: str, says: str) -> None:
    path = tmp_path / "s.yml"
    path.write_text(f"gpu_stack: {{driver: {driver}, {BASE}}}\n")
    result = check_file(path)
    assert result["exit_code"] == 2, result
    assert says in result["errors"][0]["message"]


def test_deep_nesting_a_device_a_fifo_and_a_huge_file_are_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yml"
    deep.write_text("gpu_stack: " + "[" * 5000 + "]" * 5000 + "\n")
    device = tmp_path / "device.yml"
    device.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yml"
    huge.write_text("gpu_stack: {}\n# " + "x" * (2 << 20) + "\n")
    for path, says in (
        (deep, "nested more than 32 levels deep"),
        (device, "not a regular file"),
        (fifo, "not a regular file"),
        (huge, "over the 1048576-byte limit"),
    ):
        result = check_file(path)
        assert result["exit_code"] == 2, path
        assert says in result["errors"][0]["message"], result


def test_a_billion_laughs_gives_one_line_per_problem(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    lines.append(f'gpu_stack: {{driver: "550", {BASE}, gpu: *a8}}')
    path = tmp_path / "laughs.yml"
    path.write_text("\n".join(lines) + "\n")
    result = check_file(path)
    assert result["exit_code"] == 2
    assert len(result["errors"]) == 1


def test_random_hostile_documents_never_crash_check_spec(tmp_path: Path) -> None:
    """A few hundred documents built from YAML's traps; each must end in a verdict, exit 0, 1 or
    2, with every echoed value short."""
    rng = random.Random(17)  # noqa: S311 - repeatable test data, not secrets
    values = [
        "0550",
        "0x226",
        "1e400",
        "-0",
        ".nan",
        "~",
        "[]",
        "{}",
        "!!binary aGk=",
        "&x 1",
        "*x",
        "'{{ x }}'",
        '"' + "9" * 500 + '"',
        "9" * 400,
        "3.10",
        "yes",
        "2001-12-14",
        '"\\u0000"',
        "'12.4.1'",
        '"none"',
        "[[[[1]]]]",
        "{a: {b: {c: d}}}",
        '"8.2.1"',
        '"550.54.15"',
        "|\n    multi\n    line",
        "? complex\n  : key",
    ]
    keys = [
        "driver",
        "cuda",
        "cudnn",
        "python",
        "torch",
        "torch_variant",
        "gpu",
        "os",
        "profile",
        "packages",
        "x" * 300,
    ]
    path = tmp_path / "r.yml"
    for _ in range(300):
        body = "\n".join(f"  {rng.choice(keys)}: {rng.choice(values)}" for _ in range(rng.randint(0, 8)))
        path.write_text(f"gpu_stack:\n{body}\n" if rng.random() < 0.9 else body)
        result = check_file(path)
        assert result["exit_code"] in (0, 1, 2), result
        for finding in result["errors"] + result["warnings"]:
            assert len(finding["message"]) < 1000, finding["message"]
