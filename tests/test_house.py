"""What the house keeps: the code and the docs speak to the user and the next engineer, so none of
them names an entry of this project's tracker by its number, which means nothing outside it; git's
history keeps that. A citation of another project's issue is its address (github.com/.../issues/N)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACKER = re.compile(r"\b[Ii]ssues? #?[0-9]+")


def test_nothing_tracked_names_an_issue_by_its_number() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout  # noqa: S607 - git from the PATH, as every script here
    found = []
    for name in tracked.splitlines():
        path = REPO / name
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1) if TRACKER.search(line)
        ]
    assert not found, "say what the code does, not which issue asked for it:\n" + "\n".join(found)


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_relative_link_in_the_readme_and_the_docs_leads_to_a_file() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("roles/*/README.md"))]
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()
    ]
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)
