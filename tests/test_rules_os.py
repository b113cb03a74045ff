"""The rules of the host: its OS against the declared one, and a Python the OS does not ship with
the venv backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.checkspec import check_file, check_mapping
from tests.rule_cases import stack


@pytest.mark.parametrize(
    ("facts", "rules"),
    [
        ({"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8"}, set()),
        (
            {"distribution": "Debian", "distribution_major_version": "13", "distribution_version": "13.1"},
            {"os-mismatch"},
        ),
    ],
)
def test_host_os_must_match_declared_os(facts: dict[str, str], rules: set[str]) -> None:
    result = check_mapping(stack(os="debian12"), host_facts=facts)
    assert {e["rule"] for e in result["errors"]} == rules


def test_unknown_host_os_warns() -> None:
    result = check_mapping(stack(), host_facts={"distribution": "Gentoo", "distribution_version": "2.15"})
    assert result["exit_code"] == 0
    assert {w["rule"] for w in result["warnings"]} == {"os-unknown"}


# --- a Python the OS does not ship, with the venv backend (docs/research/python-per-os.md) ---
def test_python_39_on_debian_12_is_refused_naming_the_backends_and_oses_that_serve_it() -> None:
    result = check_mapping(
        stack(
            os="debian12",
            python="3.9",
            torch="1.12.1",
            torch_variant="cu116",
            cuda="11.6.2",
            cudnn="none",
            driver="510",
        )
    )
    errors = {e["rule"]: e for e in result["errors"]}
    error = errors["os-python"]
    assert error["message"] == "Python 3.9 is not packaged for debian12, which ships 3.11"
    assert (
        error["fix"] == 'set python: "3.11" for debian12, or pytorch_env_backend: conda, or an OS that ships it (rhel9)'
    )
    assert [s["key"] for s in error["sources"]][:2] == ["debian_python_bookworm", "rhel9_python"]


@pytest.mark.parametrize(
    ("os_name", "python", "backend", "refused"),
    [
        ("debian12", "3.11", None, False),
        ("debian12", "3.12", None, True),
        ("debian12", "3.12", "conda", False),  # the channel brings its own Python
        ("debian13", "3.13", None, False),
        ("debian13", "3.11", "venv", True),
        ("ubuntu2204", "3.11", None, True),  # jammy's python3.11 is a 3.11.0 release candidate
        ("ubuntu2404", "3.12", None, False),
        ("rhel9", "3.12", None, False),
        ("rhel9", "3.10", None, True),
    ],
)
def test_python_per_os_and_backend(os_name: str, python: str, backend: str | None, refused: bool) -> None:
    result = check_mapping(stack(os=os_name, python=python, torch="2.5.1"), backend=backend)
    assert ("os-python" in {e["rule"] for e in result["errors"]}) is refused, result["errors"]


def test_the_preflight_judges_the_hosts_os_when_the_stack_names_none() -> None:
    facts = {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8"}
    result = check_mapping(stack(python="3.12"), host_facts=facts)
    assert "os-python" in {e["rule"] for e in result["errors"]}
    assert check_mapping(stack(python="3.12"))["exit_code"] == 0  # no OS known: nothing to judge


def test_check_spec_reads_the_backend_beside_the_stack(tmp_path: Path) -> None:
    path = tmp_path / "gpu_hosts.yml"
    body = 'gpu_stack: {profile: torch-2.5-cu124, os: debian12, python: "3.12"}\n'
    path.write_text(body)
    assert check_file(path)["exit_code"] == 1
    path.write_text(body + "pytorch_env_backend: conda\n")
    assert check_file(path)["exit_code"] == 0
