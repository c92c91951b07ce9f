"""Our SKILL.md verdicts against the Agent Skills reference validator (`skills-ref`).

Both must agree on the fixtures and on the usual mistakes. Where we are stricter (ASCII-only
names, string-typed metadata values, exact name without surrounding spaces) the direction is
fixed: whatever we accept, skills-ref accepts.
"""

from __future__ import annotations

import pytest
from skills_ref.validator import validate, validate_metadata

from skills_app import packaging

from .helpers import FIXTURE_NAMES, FIXTURES, skill_md


def our_verdict(folder) -> bool:
    try:
        packaging.validate_package(packaging.read_folder(folder))
    except packaging.SkillPackageError:
        return False
    return True


def skill_folder(tmp_path, text: str, folder="demo-skill"):
    path = tmp_path / folder
    path.mkdir()
    (path / "SKILL.md").write_text(text, encoding="utf-8")
    return path


AGREED = {
    "valid": (skill_md(), True),
    "valid with every optional field": (
        skill_md(
            extra="license: MIT\ncompatibility: Python 3.11\nallowed-tools: fs_read\nmetadata:\n  a: b\n"
        ),
        True,
    ),
    "uppercase name": (skill_md("Demo-Skill"), False),
    "leading hyphen": (skill_md("-demo-skill"), False),
    "double hyphen": (skill_md("demo--skill"), False),
    "underscore": (skill_md("demo_skill"), False),
    "name too long": (skill_md("a" * 65), False),
    "name is not the folder": (skill_md("other-skill"), False),
    "missing name": ("---\ndescription: d\n---\nbody\n", False),
    "missing description": ("---\nname: demo-skill\n---\nbody\n", False),
    "empty description": (skill_md(description='""'), False),
    "description too long": (skill_md(description="d" * 1025), False),
    "unknown field": (skill_md(extra="author: me\n"), False),
    "compatibility too long": (skill_md(extra=f"compatibility: {'c' * 501}\n"), False),
    "no frontmatter": ("# Just markdown\n", False),
    "unclosed frontmatter": ("---\nname: demo-skill\ndescription: d\n", False),
    "frontmatter not a mapping": ("---\njust text\n---\nbody\n", False),
}

# We refuse these; skills-ref admits them. The direction that matters still holds.
STRICTER = {
    "non-ASCII lowercase name": (skill_md("café"), "café"),
    "unquoted number in metadata": (skill_md(extra="metadata:\n  version: 1.0\n"), "demo-skill"),
    "name with surrounding spaces": (skill_md('" demo-skill "'), "demo-skill"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_fixtures_are_valid_for_both(name):
    assert validate(FIXTURES / name) == []
    assert our_verdict(FIXTURES / name)


@pytest.mark.parametrize("case", sorted(AGREED))
def test_we_agree_with_skills_ref(case, tmp_path):
    text, valid = AGREED[case]
    folder = skill_folder(tmp_path, text)

    reference = validate(folder)

    assert (reference == []) is valid, reference
    assert our_verdict(folder) is valid


@pytest.mark.parametrize("case", sorted(STRICTER))
def test_where_we_are_stricter_skills_ref_accepts(case, tmp_path):
    text, folder_name = STRICTER[case]
    folder = skill_folder(tmp_path, text, folder_name)

    assert validate(folder) == []
    assert our_verdict(folder) is False


@pytest.mark.parametrize("case", sorted(AGREED) + sorted(STRICTER))
def test_whatever_we_accept_skills_ref_accepts(case, tmp_path):
    text, folder_name = (AGREED[case][0], "demo-skill") if case in AGREED else STRICTER[case]
    folder = skill_folder(tmp_path, text, folder_name)
    if our_verdict(folder):
        assert validate(folder) == []


def test_validate_metadata_agrees_on_parsed_values():
    parsed = packaging.parse_skill_md(skill_md(extra="license: MIT\n").encode())
    assert (
        validate_metadata({"name": parsed.name, "description": parsed.description, "license": parsed.license})
        == []
    )
    assert validate_metadata({"name": "ok", "description": "d", "tags": "x"}) != []
