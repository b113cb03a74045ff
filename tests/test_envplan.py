"""The pytorch_env role's plan and lock helpers (gpuenv/envplan.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging import pylock

from gpuenv import envplan

DATA = Path(__file__).parent / "data"
INDEX = "https://download.pytorch.org/whl/{variant}"


def _plan(**over: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "torch": "2.13.0",
        "variant": "cpu",
        "python": "3.11",
        "packages": [],
        "companions": ["torchvision"],
        "index_template": INDEX,
        "pypi_url": "https://pypi.org/simple",
        "backend": "venv",
    }
    settings.update(over)
    return envplan.plan(**settings)


def test_a_non_default_build_comes_from_pytorchs_index_with_its_local_version() -> None:
    plan = _plan()
    assert plan["requirements"] == ["torch==2.13.0+cpu", "torchvision==0.28.0+cpu"]
    assert plan["torch_index"] == "https://download.pytorch.org/whl/cpu"
    assert not plan["from_pypi"]


def test_pypis_default_build_comes_from_pypi_unlabelled() -> None:
    # cu130 is PyPI's default build of 2.13 (compat.yaml torch "2.13" pypi_default)
    plan = _plan(variant="cu130", packages=["numpy==2.3.4"])
    assert plan["requirements"] == ["torch==2.13.0", "torchvision==0.28.0", "numpy==2.3.4"]
    assert plan["torch_index"] is None
    assert plan["from_pypi"]


def test_the_id_follows_the_contents() -> None:
    assert _plan()["id"] == _plan()["id"]
    assert _plan()["id"] != _plan(packages=["numpy==2.3.4"])["id"]
    assert _plan()["id"] != _plan(python="3.12")["id"]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"torch": "2.15.0"}, "torch 2.15.0 is not in the compatibility data"),
        ({"variant": "cu118"}, "has no cu118 build"),
        ({"packages": ["numpy"]}, "must be pinned as name==version: numpy"),
        ({"companions": ["torchaudio"]}, "no torchaudio release belongs to torch 2.13.0"),
    ],
)
def test_refusals_say_what_to_fix(over: dict[str, Any], message: str) -> None:
    with pytest.raises(envplan.EnvPlanError, match=message):
        _plan(**over)


def test_lock_from_pips_report_pins_every_hash() -> None:
    lock = envplan.lock_from_report((DATA / "pip-install-report-idna-six.json").read_text())
    assert lock == (
        "idna==3.10 --hash=sha256:946d195a0d259cbba61165e88e65941f16e9b36ea6ddb97f00452bae8b1287d3\n"
        "six==1.16.0 --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254\n"
    )


def test_lock_refuses_a_distribution_without_a_hash() -> None:
    report = {"install": [{"metadata": {"name": "x", "version": "1"}, "download_info": {"url": "file:///x"}}]}
    with pytest.raises(envplan.EnvPlanError, match="no sha256 for x 1"):
        envplan.lock_from_report(report)


def test_auto_companions_skip_a_library_without_a_release() -> None:
    # torchaudio has no release for torch 2.13; 2.5.1 has both
    assert _plan(companions="auto")["requirements"] == ["torch==2.13.0+cpu", "torchvision==0.28.0+cpu"]
    assert _plan(torch="2.5.1", variant="cu124", companions="auto")["requirements"] == [
        "torch==2.5.1",
        "torchvision==0.20.1",
        "torchaudio==2.5.1",
    ]


def test_a_conda_environment_takes_torch_from_the_channel_and_pip_only_for_the_rest() -> None:
    plan = _plan(backend="conda", companions=[], packages=["einops==0.8.1", "conda:six==1.16.0"])
    assert plan["conda"] == {
        "style": "conda-forge",
        "channels": ["conda-forge"],
        "specs": ["python 3.11.*", "pytorch ==2.13.0 cpu*", "six ==1.16.0", "pip"],
    }
    assert plan["requirements"] == ["einops==0.8.1"]  # pip installs what no conda spec covers
    assert plan["id"] != _plan(companions=[], packages=["einops==0.8.1"])["id"]
    # A release no channel carries: Python (and pip) from the channel, torch from its wheels.
    wheels = _plan(backend="conda", torch="2.0.1", variant="cu117", companions=[])
    assert wheels["conda"]["style"] == "wheels"
    assert wheels["requirements"] == ["torch==2.0.1"]
    assert wheels["notes"]


def test_a_conda_style_that_cannot_serve_the_stack_is_an_error_naming_what_would() -> None:
    with pytest.raises(envplan.EnvPlanError, match=r"last release there is 2\.5\.1"):
        _plan(backend="conda", conda_style="pytorch", companions=[])


def test_the_plan_names_each_companion_with_its_version_for_verify() -> None:
    assert _plan(companions="auto")["companions"] == {"torchvision": "0.28.0"}
    assert _plan(companions=[])["companions"] == {}
    conda = _plan(torch="2.5.1", variant="cu124", backend="conda", conda_style="conda-forge", companions="auto")
    assert conda["companions"] == {"torchvision": "0.20.1", "torchaudio": "2.5.1"}
    assert "torchvision ==0.20.1" in conda["conda"]["specs"]
    # The companions are not part of the id: the requirements and specs already name them.
    assert conda["id"] == envplan.env_id(
        {k: conda[k] for k in ("backend", "python", "requirements", "torch_index", "pypi", "conda")}
    )


def test_pylock_from_pips_report_is_a_valid_pep_751_lock_of_the_same_set() -> None:
    report = (DATA / "pip-install-report-idna-six.json").read_text()
    text = envplan.pylock_from_report(report, python="3.11")
    lock = pylock.Pylock.from_dict(tomllib.loads(text))  # packaging's reader validates the standard
    assert str(lock.lock_version) == "1.0"
    got = {(p.name, str(p.version), p.wheels[0].hashes["sha256"]) for p in lock.packages if p.wheels}
    want = {tuple(line.replace("==", " ").replace(" --hash=sha256:", " ").split()) for line in
            envplan.lock_from_report(report).splitlines()}  # fmt: skip
    assert got == want
    assert all(p.wheels and str(p.wheels[0].url).endswith(".whl") for p in lock.packages)


def test_pylock_writes_a_source_build_as_an_sdist_and_refuses_what_is_neither() -> None:
    def report(url: str) -> dict[str, Any]:
        archive = {"url": url, "archive_info": {"hashes": {"sha256": "a" * 64}}}
        return {"install": [{"metadata": {"name": "x", "version": "1"}, "download_info": archive}]}

    text = envplan.pylock_from_report(report("https://x/x-1.tar.gz"), python="3.11")
    (package,) = pylock.Pylock.from_dict(tomllib.loads(text)).packages
    assert package.sdist is not None
    assert package.sdist.hashes == {"sha256": "a" * 64}
    with pytest.raises(envplan.EnvPlanError, match="neither a wheel nor a source archive"):
        envplan.pylock_from_report(report("https://x/x-1.egg"), python="3.11")
