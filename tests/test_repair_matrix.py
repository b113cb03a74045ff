"""The fault x repair matrix's table in docs/reliability.md and its rows in
tests/fleet/matrix.py, which test_5_repair.py injects and proves, say the same: a row added,
changed or removed in one and not the other fails here."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fleet.matrix import ROWS, STAMP

DOC = Path(__file__).resolve().parents[1] / "docs/reliability.md"
SECTION = "## Running it again repairs what verify finds"


def _table() -> list[list[str]]:
    text = DOC.read_text()
    assert SECTION in text, f"{DOC} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("| fault |")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in rows]


def test_the_table_in_docs_reliability_md_is_the_matrix_the_tests_run() -> None:
    table = _table()
    assert [
        (fault, detected, repaired, re.sub(r"^`test_5_repair\.py` `([a-z0-9-]+)` \((sb[0-9])\)$", r"\1 \2", test))
        for fault, detected, repaired, test in table
    ] == [
        (row.fault, ", ".join(f"`{d}`" for d in row.detected_by), row.repaired_by, f"{row.key} {row.host}")
        for row in ROWS
    ]


def test_every_row_is_flagged_by_a_check_that_also_runs_without_the_stamp_or_says_it_is_stamp_only() -> None:
    keys = [row.key for row in ROWS]
    assert len(keys) == len(set(keys))
    for row in ROWS:
        assert row.detected_by, row.key
        assert row.promise in {"repair", "refuse"}, row.key
        # Every row the stamp sees counts it: a fault changes a place site.yml's stages write.
        assert STAMP in row.detected_by, row.key
