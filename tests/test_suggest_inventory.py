"""gpuenv suggest --inventory: the GPUs a fleet's hosts recorded, read from saved `ansible -m setup --tree`
output (tests/data/suggest-facts, made from real runs; see that directory's README row)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuenv import cli, fleetfacts
from gpuenv.checkspec import check_mapping

FACTS = Path(__file__).parent / "data" / "suggest-facts"

HOSTS = """\
all:
  children:
    gpu_hosts:
      children:
        legacy:
          hosts:
            gpu01:
            gpu02:
        new:
          hosts:
            gpu03:
            gpu09:
            gpu10:
    other:
      hosts:
        db01:
"""


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text(HOSTS)
    (inv / "group_vars" / "gpu_hosts.yml").write_text(
        'gpu_stack:\n  profile: torch-2.9-cu126-legacy\n  os: debian12\n  python: "3.11"\n'
    )
    # gpu03 has no gpuenv record yet: only the inventory says what it has.
    (inv / "host_vars" / "gpu03.yml").write_text(
        'gpu_stack:\n  profile: torch-2.14-cu130\n  os: debian12\n  python: "3.11"\n  gpu: "NVIDIA H100 80GB HBM3"\n'
    )
    return inv


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["suggest", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_saved_facts_are_read_per_host() -> None:
    tree = fleetfacts.read_tree(FACTS)
    assert sorted(tree) == ["gpu01", "gpu02", "gpu03", "gpu09"]
    # gpu01's record lists its GPUs twice, declared and detected by the preflight: the detected ones count.
    pairs, how, local = fleetfacts._from_record("gpu01", tree["gpu01"])
    assert pairs == [("NVIDIA GeForce RTX 3060", "8.6"), ("Tesla V100-SXM2-16GB", "7.0")]
    assert how == "detected by the preflight"
    assert local["nvidia_driver"]["version"] == "580.95.05"
    # gpu02's preflight ran before a driver could list GPUs: its record has only the declared P100.
    assert fleetfacts._from_record("gpu02", tree["gpu02"])[:2] == (
        [("P100", "6.0")],
        "declared in its record (the preflight found no GPU to list: no driver yet)",
    )
    assert fleetfacts._from_record("gpu03", tree["gpu03"])[:2] == ([], "no gpuenv record (site.yml has not run there)")
    pairs, how, _ = fleetfacts._from_record("gpu09", tree["gpu09"])
    assert pairs == []
    assert how.startswith("unreachable when the facts were saved (Task failed: Failed to connect")


def test_suggest_for_an_inventory(capsys: pytest.CaptureFixture[str], inventory: Path) -> None:
    code, result = run(capsys, "--inventory", str(inventory), "--facts", str(FACTS))
    assert code == 0
    hosts = {g["label"]: g["hosts"] for g in result["gpus"]}
    assert hosts == {
        "NVIDIA GeForce RTX 3060": ["gpu01"],
        "Tesla V100-SXM2-16GB": ["gpu01"],
        "P100": ["gpu02"],
        "NVIDIA H100 80GB HBM3": ["gpu03"],  # from the inventory: gpu03 has no record
    }
    notes = "\n".join(result["notes"])
    assert "gpu03: no gpuenv record" in notes
    assert "gpu09: unreachable when the facts were saved" in notes
    assert "gpu10: no saved facts, and the inventory declares no GPU for it: left out" in notes
    assert "db01" not in notes  # not in gpu_hosts
    # Every recorded host runs debian12 (resolved.host_os), so the OS constraint comes from them.
    assert result["constraints"] == {"os": "--os debian12"}
    stack = result["stacks"][0]["document"]["gpu_stack"]
    # Pascal (P100) keeps the fleet on torch 2.14.1's cu126 build and driver R580, Debian 12 on Python
    # 3.11: the same derivation as test_suggest.test_pascal_and_hopper (Volta and Ampere are covered by
    # cu126's sass 7.0 and 8.6).
    assert (stack["torch"], stack["torch_variant"], stack["driver"], stack["python"]) == (
        "2.14.1",
        "cu126",
        "580",
        "3.11",
    )
    assert check_mapping(stack)["exit_code"] == 0
    # The fleet runs R580 already (gpu01's nvidia_driver fact), the same branch: nothing to keep instead.
    assert "keep-driver" not in {a["kind"] for a in result["alternatives"]}


def test_the_fleets_driver_is_an_alternative(
    capsys: pytest.CaptureFixture[str], inventory: Path, tmp_path: Path
) -> None:
    facts = tmp_path / "facts"
    shutil.copytree(FACTS, facts)
    saved = json.loads((facts / "gpu01").read_text())
    saved["ansible_facts"]["ansible_local"]["nvidia_driver"]["version"] = "550.163.01"
    (facts / "gpu01").write_text(json.dumps(saved))
    code, result = run(capsys, "--inventory", str(inventory), "--facts", str(facts))
    assert code == 0
    keep = next(a for a in result["alternatives"] if a["kind"] == "keep-driver")
    assert keep["title"].startswith("keep driver 550 (what the fleet's hosts run now")
    # R550 fully supports runtimes up to 12.4 (12.4.0: 550.54.14). Every build of torch 2.8 and newer is
    # CUDA 12.6 or later (12.6.0: 560.28.03), so torch 2.7.1 is the newest, and of its builds cu126 needs
    # 560 and cu128 lacks sass 6.0 and 7.0: cu118 (11.8.0: 520.61.05) with sass 6.0, 7.0, 8.6 and 9.0.
    kept = keep["stacks"][0]["document"]["gpu_stack"]
    assert (kept["torch"], kept["torch_variant"], kept["driver"]) == ("2.7.1", "cu118", "550")
    assert check_mapping(kept)["exit_code"] == 0


def test_without_saved_facts_the_declared_gpus_are_used(
    capsys: pytest.CaptureFixture[str], inventory: Path, tmp_path: Path
) -> None:
    code, result = run(capsys, "--inventory", str(inventory), "--facts", str(tmp_path / "none"))
    assert code == 0
    assert [g["label"] for g in result["gpus"]] == ["NVIDIA H100 80GB HBM3"]
    assert any("ansible gpu_hosts -i" in n and "--tree" in n for n in result["notes"])


def test_inventory_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["suggest", "--inventory", str(tmp_path / "missing")])
    assert code == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    db01:\n")
    code = cli.main(["suggest", "--inventory", str(tmp_path / "hosts.yml")])
    assert code == 2
    assert "has no hosts in gpu_hosts" in capsys.readouterr().err
