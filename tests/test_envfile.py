"""A team's environment.yml as a conda environment's declaration (gpuenv/envfile.py, through
gpuenv.envplan), and the URLs of its channels (gpuenv.condaplan.channel_urls)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuenv import condaplan, envfile, envplan

TEAM_FILE = """
name: vision
channels:
  - conda-forge
  - http://mirror.example/conda-extra
dependencies:
  - python=3.11
  - pytorch=2.5.1
  - torchvision
  - numpy>=2
  - conda-forge::pillow
  - pip
  - pip:
      - einops==0.8.1
"""


def _plan(document: Any, **over: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "torch": "2.5.1",
        "variant": "cu124",
        "python": "3.11",
        "packages": [],
        "companions": "auto",
        "index_template": "https://download.pytorch.org/whl/{variant}",
        "pypi_url": "https://pypi.org/simple",
        "backend": "conda",
        "conda_style": "conda-forge",
        "environment": document,
    }
    settings.update(over)
    return envplan.plan(**settings)


def test_a_team_file_joins_the_plan_the_stack_keeping_torch_and_python() -> None:
    plan = _plan(yaml.safe_load(TEAM_FILE))
    specs = plan["conda"]["specs"]
    assert specs[:2] == ["python 3.11.*", "pytorch ==2.5.1 cuda*"]
    # a bare name keeps the plan's pin of a companion; what the plan lacks is added as written
    assert "torchvision ==0.20.1" in specs
    assert "numpy>=2" in specs
    assert "conda-forge::pillow" in specs
    assert specs.count("pip") == 1
    assert plan["requirements"] == ["einops==0.8.1"]
    assert plan["conda"]["channels"] == ["conda-forge", "http://mirror.example/conda-extra"]


def test_the_file_changes_the_environments_id() -> None:
    without = _plan(None)
    assert _plan(yaml.safe_load(TEAM_FILE))["id"] != without["id"]


def test_a_versioned_companion_in_the_file_replaces_the_plans_pin() -> None:
    doc = {"channels": ["conda-forge"], "dependencies": ["torchvision 0.20.*"]}
    plan = _plan(doc)
    # verify then expects no single torchvision version; torchaudio keeps the plan's
    assert plan["companions"] == {"torchaudio": "2.5.1"}
    specs = plan["conda"]["specs"]
    assert "torchvision 0.20.*" in specs
    assert "torchvision ==0.20.1" not in specs


@pytest.mark.parametrize(
    ("dependency", "message"),
    [
        ("pytorch=2.4.1", "asks for 'pytorch=2.4.1', but the stack declares torch 2.5.1"),
        ("pytorch==2.5.0", "asks for 'pytorch==2.5.0', but the stack declares torch 2.5.1"),
        ("pytorch>=2.6", "asks for 'pytorch>=2.6', but the stack declares torch 2.5.1"),
        ("torch 2.4.*", "asks for 'torch 2.4.*', but the stack declares torch 2.5.1"),
        ("python=3.13", "asks for 'python=3.13', but the stack declares Python 3.11"),
        ("pytorch=2.4.1=cuda118*", "asks for 'pytorch=2.4.1=cuda118*'"),
    ],
)
def test_another_torch_or_python_is_refused_naming_both_sides(dependency: str, message: str) -> None:
    with pytest.raises(envplan.EnvPlanError, match="make them one") as info:
        _plan({"channels": ["conda-forge"], "dependencies": [dependency]})
    assert message in str(info.value)


@pytest.mark.parametrize(
    "dependency", ["pytorch", "pytorch=2.5", "pytorch=2.5.1", "pytorch==2.5.1", "pytorch 2.5.*", "pytorch>=2.4,<2.6",
                   "pytorch 2.4|2.5", "pytorch=2.5.1=cuda124*", "python 3.11.*", "python>=3.10"],
)  # fmt: skip
def test_pins_the_stack_meets_are_accepted(dependency: str) -> None:
    assert _plan({"channels": ["conda-forge"], "dependencies": [dependency]})["conda"]["specs"][0] == "python 3.11.*"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "not a mapping"),
        ({"channels": "conda-forge", "dependencies": ["numpy"]}, "channels must be a list"),
        ({"channels": ["conda-forge"]}, "dependencies must be a non-empty list"),
        ({"dependencies": [{"npm": ["x"]}]}, "neither a conda dependency nor a pip: list"),
        ({"dependencies": [42]}, "is not a string"),
        ({"dependencies": [{"pip": ["--index-url https://x"]}]}, "pytorch_env_pypi_url"),
        ({"dependencies": [{"pip": ["einops"]}]}, "must be pinned as name==version: einops"),
    ],
)
def test_a_malformed_file_says_what_is_wrong(document: Any, message: str) -> None:
    with pytest.raises(envplan.EnvPlanError, match=message):
        _plan(document)


def test_a_file_for_a_venv_is_refused_with_the_backend_to_set() -> None:
    with pytest.raises(envplan.EnvPlanError, match="pytorch_env_backend: conda"):
        _plan({"dependencies": ["numpy"]}, backend="venv-uv")


def test_nodefaults_is_not_a_channel() -> None:
    assert (
        envfile.read({"channels": ["nodefaults"], "dependencies": ["numpy"]}, torch="2.5.1", python="3.11")["channels"]
        == []
    )


def test_channel_urls_by_name_or_as_given_and_the_unknown_named() -> None:
    named = {"conda-forge": "http://10.199.0.1:8000/conda"}
    got = condaplan.channel_urls(["conda-forge", "https://mirror.example/extra", "bioconda"], named)
    assert got == {"urls": ["http://10.199.0.1:8000/conda", "https://mirror.example/extra"], "unknown": ["bioconda"]}
