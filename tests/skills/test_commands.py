"""`manage.py skill_import` / `skill_export`: stdout is the skill name, refusals are CommandErrors
naming the field, nothing is written."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from skills_app import packaging
from skills_app.models import Skill, SkillVersion

from .helpers import FIXTURE_NAMES, FIXTURES, folder_files, make_zip, skill_md, symlink_zip

pytestmark = pytest.mark.django_db
PROJECT = Path(__file__).resolve().parents[2]


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def zip_file(tmp_path, data: bytes, name="skill.zip") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_import_prints_only_the_name_and_export_gives_the_folder_back(name, tenant_a, tmp_path):
    out, err = run("skill_import", str(FIXTURES / name), "--tenant", tenant_a.slug)
    assert out == f"{name}\n" and "created" in err

    exported, _ = run("skill_export", name, "--tenant", tenant_a.slug, "--out", str(tmp_path / "out"))

    assert exported.strip() == str(tmp_path / "out" / name)
    assert folder_files(tmp_path / "out" / name) == folder_files(FIXTURES / name)


def test_zip_export_then_import_is_unchanged(tenant_a, tmp_path):
    run("skill_import", str(FIXTURES / "pdf-report"), "--tenant", tenant_a.slug)
    target = tmp_path / "pdf.zip"
    run("skill_export", "pdf-report", "--tenant", tenant_a.slug, "--out", str(target))

    out, err = run("skill_import", str(target), "--tenant", tenant_a.slug)

    assert out == "pdf-report\n" and "unchanged" in err
    assert SkillVersion.objects.count() == 1


def test_global_skills(tenant_a, tmp_path):
    out, _ = run("skill_import", str(FIXTURES / "research-guide"), "--global")
    assert out == "research-guide\n"
    assert Skill.objects.get().tenant_id is None
    run("skill_export", "research-guide", "--global", "--out", str(tmp_path))
    assert (tmp_path / "research-guide" / "SKILL.md").exists()
    with pytest.raises(CommandError, match="No Skill|No of tenant"):
        run("skill_export", "research-guide", "--tenant", tenant_a.slug, "--out", str(tmp_path / "x"))


@pytest.mark.parametrize(
    "entries, expected",
    [
        ({"demo-skill/SKILL.md": skill_md("Demo-Skill")}, "name: "),
        ({"demo-skill/SKILL.md": skill_md(description='""')}, "description: "),
        ({"demo-skill/SKILL.md": skill_md(extra="author: me\n")}, "frontmatter: unknown field(s) author"),
        (
            {"demo-skill/SKILL.md": skill_md(), "demo-skill/../x": "x"},
            "archive: entry demo-skill/../x escapes",
        ),
        ({"demo-skill/SKILL.md": skill_md(), "/abs": "x"}, "archive: entry /abs is an absolute path"),
        ({"demo-skill/readme.md": "x"}, "skill_md: no SKILL.md"),
    ],
)
def test_bad_zips_are_refused_naming_the_field(entries, expected, tenant_a, tmp_path):
    with pytest.raises(CommandError) as caught:
        run("skill_import", zip_file(tmp_path, make_zip(entries)), "--tenant", tenant_a.slug)
    assert expected in str(caught.value)
    assert not Skill.objects.exists()


def test_other_refusals(tenant_a, tmp_path, settings):
    cases = [
        (zip_file(tmp_path, symlink_zip(), "link.zip"), "archive: entry demo-skill/link is a symbolic link"),
        (zip_file(tmp_path, b"garbage", "bad.zip"), "archive: not a readable zip file"),
        (
            zip_file(tmp_path, make_zip({"SKILL.md": skill_md(), "z": b"\0" * 6_000_000}), "big.zip"),
            "files: ",
        ),
    ]
    folder = tmp_path / "demo-skill"
    folder.mkdir()
    (folder / "SKILL.md").write_text(skill_md())
    (folder / "link").symlink_to(folder / "SKILL.md")
    cases.append((str(folder), "files: link is a symbolic link"))
    for path, expected in cases:
        with pytest.raises(CommandError) as caught:
            run("skill_import", path, "--tenant", tenant_a.slug)
        assert expected in str(caught.value)
    with pytest.raises(CommandError, match="No tenant"):
        run("skill_import", str(FIXTURES / "pdf-report"), "--tenant", "nope")
    settings.XAGENT_SKILL_MAX_FILES = 2
    with pytest.raises(CommandError, match="files: the skill has more than 2 files"):
        run("skill_import", str(FIXTURES / "pdf-report"), "--tenant", tenant_a.slug)
    assert not Skill.objects.exists()


def test_export_refuses_an_existing_target(tenant_a, tmp_path):
    run("skill_import", str(FIXTURES / "research-guide"), "--tenant", tenant_a.slug)
    run("skill_export", "research-guide", "--tenant", tenant_a.slug, "--out", str(tmp_path))
    with pytest.raises(CommandError, match="already exists"):
        run("skill_export", "research-guide", "--tenant", tenant_a.slug, "--out", str(tmp_path))


@pytest.mark.django_db(transaction=True)
def test_the_real_command_exit_codes_and_stdout(tmp_path):
    """One real `manage.py` process per outcome, on a database of its own."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    env.pop("REDIS_URL", None)

    def manage(*args):
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert manage("migrate", "-v", "0").returncode == 0
    assert manage("create_tenant", "acme").returncode == 0

    done = manage("skill_import", str(FIXTURES / "csv-cleanup"), "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "csv-cleanup\n"

    bad = tmp_path / "bad.zip"
    bad.write_bytes(make_zip({"demo-skill/SKILL.md": skill_md(), "demo-skill/../x": "x"}))
    refused = manage("skill_import", str(bad), "--tenant", "acme")
    assert refused.returncode != 0 and refused.stdout == ""
    assert "archive: entry demo-skill/../x escapes the skill folder" in refused.stderr


def test_seed_demo_imports_the_demo_skills_once(settings, tmp_path):
    settings.XAGENT_WORKSPACES_DIR = tmp_path / "workspaces"
    first, _ = run("seed_demo")
    skill = Skill.objects.get(tenant__slug="demo", name="research-guide")
    packaging.import_skill_md(skill, skill_md("research-guide", body="# Edited by an admin\n"))

    second, _ = run("seed_demo")

    # (The login line differs between runs outside embedded mode: the password is set once.)
    skills_line = "Demo skills: csv-cleanup, pdf-report, research-guide, support-weekly-report"
    assert skills_line in first.splitlines() and skills_line in second.splitlines()
    assert Skill.objects.filter(tenant__slug="demo").count() == 4
    assert SkillVersion.objects.filter(skill__tenant__slug="demo").count() == 5
    skill.refresh_from_db()
    assert skill.version == 2 and skill.body == "# Edited by an admin"
    assert skill.versions.get(number=1).origin == "seed"
