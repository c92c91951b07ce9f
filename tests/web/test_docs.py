"""The docs work as written (issue #27): every link in README.md and docs/ resolves inside the
repository (a heading for an anchor) or points at public documentation; commands use the
project's virtualenv (`.venv/bin/python`, `make …`), never a bare `python`; README stays a front
door. tests/integration/test_readme_quickstart.py runs the README's quickstart itself."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Links may leave the repository only for public documentation.
PUBLIC_DOCS = {
    "docs.djangoproject.com",
    "docs.celeryq.dev",
    "channels.readthedocs.io",
    "www.django-rest-framework.org",
    "drf-spectacular.readthedocs.io",
    "modelcontextprotocol.io",
    "platform.openai.com",
    "www.postgresql.org",
    "redis.io",
    "github.com",
    "pypi.org",
    "developer.mozilla.org",
    "agentskills.io",  # the Agent Skills specification
}
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
MAX_README_LINES = 250
MAX_TABLE_CELL_CHARS = 600


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    kept = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path):
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return [m.group(2) for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_in_the_repository_or_is_public_documentation(page):
    broken = []
    for target in links(page):
        parts = urlsplit(target)
        if parts.scheme in ("http", "https"):
            if parts.hostname not in PUBLIC_DOCS:
                broken.append(f"{target}: leaves the repository")
            continue
        if parts.scheme:
            broken.append(f"{target}: not a relative link")
            continue
        path = (page.parent / parts.path).resolve() if parts.path else page
        if not path.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no such file")
        elif parts.fragment and path.suffix == ".md" and parts.fragment not in anchors(path):
            broken.append(f"{target}: no heading #{parts.fragment} in {path.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_use_the_projects_virtualenv(page):
    """`python manage.py …` fails on a fresh clone (Django is in .venv only)."""
    bare = []
    for block in FENCE.findall(page.read_text()):
        for line in block.splitlines()[1:-1]:
            command = line.strip()
            if re.match(r"^(?:\w+=\S+ )*(python3?|pip3?|celery|daphne|pytest)\b", command):
                bare.append(command)
    assert not bare, f"use .venv/bin/… or a make target: {bare}"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    for command in ("make run", "make test"):
        assert command in text
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, f"README does not point to docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_table_cell_is_a_wall_of_text(page):
    long_cells = [
        cell[:60]
        for line in page.read_text().splitlines()
        if line.startswith("|")
        for cell in line.strip("|").split("|")
        if len(cell) > MAX_TABLE_CELL_CHARS
    ]
    assert not long_cells, (
        f"cells over {MAX_TABLE_CELL_CHARS} characters (make them paragraphs): {long_cells}"
    )
