"""The conda way to pin a stack's torch (gpuenv/condaplan.py over gpuenv/data/conda.yaml). Each
expected spec names the data row (and its source) it follows from."""

from __future__ import annotations

import pytest

from gpuenv import compat, condaplan
from gpuenv.condaplan import CondaPlanError, plan, read_conda_command

# What PyTorch's previous-versions page gave people (pt_prev), copied as they copy it.
RECIPE = "conda install pytorch==1.12.1 torchvision==0.13.1 torchaudio==0.12.1 cudatoolkit=11.3 -c pytorch"


def test_the_recipe_people_follow_is_read_back_into_its_stack() -> None:
    assert read_conda_command(RECIPE) == {
        "torch": "1.12.1",
        "variant": "cu113",
        "companions": {"torchvision": "0.13.1", "torchaudio": "0.12.1"},
        "channels": ["pytorch"],
        "style": "pytorch",
    }


def test_the_old_style_stack_gives_the_channels_own_specs() -> None:
    # pytorch_channel 1.12.1: cudatoolkit 11.3 from -c pytorch alone, companions 0.13.1 / 0.12.1.
    got = plan(torch="1.12.1", variant="cu113", python="3.9", style="pytorch")
    assert got == {
        "style": "pytorch",
        "channels": ["pytorch"],
        "specs": [
            "python 3.9.*",
            "pytorch ==1.12.1",
            "torchvision ==0.13.1",
            "torchaudio ==0.12.1",
            "cudatoolkit ==11.3",
        ],
        "companions": {"torchvision": "0.13.1", "torchaudio": "0.12.1"},
        "notes": [],
    }
    # The same specs as the command on the page, spec for spec.
    asked = read_conda_command(RECIPE)
    page = plan(torch=asked["torch"], variant=asked["variant"], python="3.9", style=asked["style"])
    assert {s.split()[0]: s.split()[1].lstrip("=") for s in page["specs"][1:]} == {
        "pytorch": "1.12.1",
        "torchvision": "0.13.1",
        "torchaudio": "0.12.1",
        "cudatoolkit": "11.3",
    }


@pytest.mark.parametrize(
    ("torch", "variant", "specs_tail", "channels"),
    [
        # 1.12.x with CUDA 11.6: cudatoolkit came from conda-forge (pt_prev adds -c conda-forge).
        ("1.12.1", "cu116", ["cudatoolkit ==11.6"], ["pytorch", "conda-forge"]),
        # From 1.13: pytorch-cuda=X.Y with -c nvidia (pt_prev, pt_builder).
        ("2.0.1", "cu117", ["pytorch-cuda ==11.7"], ["pytorch", "nvidia"]),
        ("2.5.1", "cu124", ["pytorch-cuda ==12.4"], ["pytorch", "nvidia"]),
        ("2.5.1", "cpu", ["cpuonly"], ["pytorch"]),
        # The page's 11.3 for 1.9.1 is a known error: the packages are 11.1 (pytorch.github.io#1403).
        ("1.9.1", "cu111", ["cudatoolkit ==11.1"], ["pytorch", "conda-forge"]),
    ],
)
def test_pytorch_channel_specs_per_era(torch: str, variant: str, specs_tail: list[str], channels: list[str]) -> None:
    got = plan(torch=torch, variant=variant, python="3.10", style="pytorch", companions=[])
    assert got["specs"] == ["python 3.10.*", f"pytorch =={torch}", *specs_tail]
    assert got["channels"] == channels


def test_pytorch_channel_refusals_name_what_would_serve() -> None:
    with pytest.raises(CondaPlanError, match=r"its last release there is 2\.5\.1"):
        plan(torch="2.6.0", variant="cu126", python="3.12", style="pytorch")
    with pytest.raises(CondaPlanError, match=r"built pytorch 1\.12\.1 for CUDA 10\.2, 11\.3, 11\.6, not 11\.8"):
        plan(torch="1.12.1", variant="cu118", python="3.9", style="pytorch")


def test_conda_forge_pins_the_build_by_cuda_major_and_runtime() -> None:
    # conda_forge 2.5.1: CUDA 11.8, 12.0, 12.6 (no 12.4), Python 3.9-3.13, torchvision 0.20.1,
    # torchaudio 2.5.1; a CUDA build needs cuda-version >= its X.Y within the major (cf_cv).
    got = plan(torch="2.5.1", variant="cu124", python="3.13", style="conda-forge")
    assert got["channels"] == ["conda-forge"]
    assert got["specs"] == [
        "python 3.13.*",
        "pytorch ==2.5.1 cuda*",
        "cuda-version >=12.4,<13",
        "torchvision ==0.20.1",
        "torchaudio ==2.5.1",
    ]
    assert got["notes"] == [
        "conda-forge built pytorch 2.5.1 for CUDA 11.8, 12.0, 12.6: the solver takes the newest build of CUDA 12 "
        "with a runtime of at least 12.4"
    ]
    cpu = plan(torch="2.13.0", variant="cpu", python="3.11", style="conda-forge")
    assert cpu["specs"] == ["python 3.11.*", "pytorch ==2.13.0 cpu*", "torchvision ==0.28.0"]
    assert cpu["notes"] == []


@pytest.mark.parametrize(
    ("torch", "variant", "python", "says"),
    [
        ("2.0.1", "cu117", "3.11", "conda-forge has no pytorch 2.0.1"),
        ("2.5.1", "cu124", "3.14", "for Python 3.9 to 3.13, not 3.14"),
        ("2.5.1", "cu130", "3.12", "none of them CUDA 13.0's major"),
    ],
)
def test_conda_forge_refusals(torch: str, variant: str, python: str, says: str) -> None:
    with pytest.raises(CondaPlanError, match=says):
        plan(torch=torch, variant=variant, python=python, style="conda-forge")
    # auto takes the wheels instead, with Python from the channel
    auto = plan(torch=torch, variant=variant, python=python)
    assert (auto["style"], auto["specs"]) == ("wheels", [f"python {python}.*", "pip"])


def test_conda_packages_beside_pip_ones() -> None:
    got = plan(torch="2.13.0", variant="cpu", python="3.11", companions=[], packages=["conda:einops==0.8.1", "six==1"])
    assert got["specs"][-1] == "einops ==0.8.1"
    with pytest.raises(CondaPlanError, match="conda:name==version"):
        plan(torch="2.13.0", variant="cpu", python="3.11", packages=["conda:Bad Name"])
    with pytest.raises(CondaPlanError, match=r"has no torchaudio built for pytorch 2\.13\.0"):
        plan(torch="2.13.0", variant="cpu", python="3.11", style="conda-forge", companions=["torchaudio"])


def test_a_command_without_a_build_choice_is_refused() -> None:
    with pytest.raises(CondaPlanError, match="neither cudatoolkit"):
        read_conda_command("conda install pytorch==2.0.1 -c pytorch")
    assert read_conda_command("conda install pytorch==2.0.1 cpuonly -c pytorch")["variant"] == "cpu"
    assert read_conda_command("conda install pytorch==2.0.1 pytorch-cuda=11.8 -c pytorch -c nvidia")["variant"] == (
        "cu118"
    )


def test_the_channels_companions_agree_with_the_wheels_pairs_except_where_the_channel_built_its_own() -> None:
    # PyTorch's channel carried 2.0.0's first torchvision 0.15.0 / torchaudio 2.0.0, which PyPI yanked;
    # conda-forge built torchvision 0.15.2 for 2.0.0 and 0.16.1 for 2.1.0 and 2.1.2 (cf_tv).
    own = {
        ("pytorch", "2.0.0", "torchvision"),
        ("pytorch", "2.0.0", "torchaudio"),
        ("conda_forge", "2.0.0", "torchvision"),
        ("conda_forge", "2.1.0", "torchvision"),
        ("conda_forge", "2.1.2", "torchvision"),
    }
    pairs = compat.load().raw["torch_companions"]["releases"]
    differing = set()
    for table, key in (("pytorch", "pytorch_channel"), ("conda_forge", "conda_forge")):
        for release, entry in condaplan.data()[key]["releases"].items():
            for name in ("torchvision", "torchaudio"):
                if entry.get(name) and release in pairs and entry[name] != pairs[release].get(name):
                    differing.add((table, release, name))
    assert differing == own


def test_every_table_names_sources_that_exist() -> None:
    known = set(condaplan.data()["sources"])
    for key in ("conda_forge", "pytorch_channel"):
        assert set(condaplan.data()[key]["source"]) <= known
