"""skills_app.packaging: readers, validation, imports with history, byte-identical export."""

from __future__ import annotations

import io
import os
import shutil
import stat
import struct
import zipfile

import pytest

from skills_app import packaging
from skills_app.models import Skill, SkillFile, SkillVersion
from skills_app.packaging import SkillPackageError

from .helpers import FIXTURE_NAMES, FIXTURES, folder_files, make_zip, skill_md, symlink_zip

pytestmark = pytest.mark.django_db


def refusal(call, *args, **kwargs) -> SkillPackageError:
    with pytest.raises(SkillPackageError) as caught:
        call(*args, **kwargs)
    return caught.value


def import_folder(path, tenant, by="test"):
    return packaging.import_package(packaging.read_folder(path), tenant=tenant, by=by, origin="folder")


class TestRoundTrips:
    @pytest.mark.parametrize("name", FIXTURE_NAMES)
    def test_folder_import_export_gives_back_every_byte(self, name, tenant_a, tmp_path):
        result = import_folder(FIXTURES / name, tenant_a)
        assert result.status == "created" and result.skill.name == name and result.skill.version == 1

        out = packaging.export_to_folder(result.skill, tmp_path)

        assert out == tmp_path / name
        assert folder_files(out) == folder_files(FIXTURES / name)

    @pytest.mark.parametrize("name", FIXTURE_NAMES)
    def test_zip_export_import_export_is_byte_identical(self, name, tenant_a):
        skill = import_folder(FIXTURES / name, tenant_a).skill
        first = packaging.export_zip(skill)

        again = packaging.import_package(packaging.read_zip(first), tenant=tenant_a, by="t", origin="zip")

        assert again.status == "unchanged" and again.skill.pk == skill.pk
        assert SkillVersion.objects.filter(skill=skill).count() == 1
        assert packaging.export_zip(again.skill) == first

    def test_the_zip_has_one_top_folder_sorted_entries_fixed_dates_and_modes(self, tenant_a):
        skill = import_folder(FIXTURES / "pdf-report", tenant_a).skill
        archive = zipfile.ZipFile(io.BytesIO(packaging.export_zip(skill)))
        names = archive.namelist()

        assert names == sorted(names) and all(n.startswith("pdf-report/") for n in names)
        assert {i.date_time for i in archive.infolist()} == {packaging.ZIP_DATE_TIME}
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
        assert modes["pdf-report/scripts/check.sh"] == stat.S_IFREG | 0o755
        assert modes["pdf-report/scripts/render.py"] == stat.S_IFREG | 0o644

    def test_the_projection_comes_from_the_frontmatter(self, tenant_a):
        skill = import_folder(FIXTURES / "csv-cleanup", tenant_a).skill

        assert skill.license == "MIT"
        assert skill.allowed_tools == "fs_read fs_write shell_exec"
        assert skill.metadata == {"author": "Example Data Team", "version": "1.2"}
        assert skill.body.startswith("# CSV cleanup") and skill.description.startswith("Clean a messy CSV")
        assert [f.path for f in packaging.list_resources(skill)] == [
            "assets/expected_columns.csv",
            "assets/sample_messy.csv",
        ]
        raw = (FIXTURES / "csv-cleanup/assets/sample_messy.csv").read_bytes()
        assert packaging.read_resource(skill, "assets/sample_messy.csv") == raw


class TestVersions:
    def test_a_changed_skill_md_makes_version_2_and_keeps_version_1(self, tenant_a, tmp_path):
        folder = tmp_path / "research-guide"
        shutil.copytree(FIXTURES / "research-guide", folder)
        first = import_folder(folder, tenant_a).skill
        packaging.set_enabled(first, False)
        original = (folder / "SKILL.md").read_bytes()
        (folder / "SKILL.md").write_bytes(original.replace(b"# Research guide", b"# Research guide, v2"))

        result = import_folder(folder, tenant_a)

        skill = result.skill
        assert result.status == "updated" and skill.pk == first.pk
        assert skill.version == 2 and skill.current_version.number == 2
        assert skill.body.startswith("# Research guide, v2")
        assert skill.enabled is False  # an import never switches a Skill on or off
        v1 = SkillVersion.objects.get(skill=skill, number=1)
        assert bytes(v1.skill_md) == original

    def test_a_pasted_skill_md_keeps_the_resources(self, tenant_a):
        skill = import_folder(FIXTURES / "pdf-report", tenant_a).skill
        text = (FIXTURES / "pdf-report/SKILL.md").read_text().replace("two pages", "three pages")

        result = packaging.import_skill_md(skill, text.replace("\n", "\r\n"), by="admin")

        assert result.status == "updated" and result.version.origin == "paste"
        assert "three pages" in result.skill.body
        assert [f.path for f in packaging.list_resources(result.skill)] == [
            "references/layout.md",
            "scripts/check.sh",
            "scripts/render.py",
        ]
        assert b"\r\n" not in bytes(result.version.skill_md)

    def test_a_new_version_must_keep_the_name(self, tenant_a):
        skill = import_folder(FIXTURES / "pdf-report", tenant_a).skill

        error = refusal(packaging.import_skill_md, skill, skill_md("other-name"))

        assert list(error.errors) == ["name"]
        assert SkillVersion.objects.filter(skill=skill).count() == 1

    def test_a_tenant_skill_and_a_global_one_share_a_name(self, tenant_a):
        own = import_folder(FIXTURES / "pdf-report", tenant_a).skill
        shared = import_folder(FIXTURES / "pdf-report", None).skill

        assert own.pk != shared.pk and shared.tenant_id is None and own.tenant_id == tenant_a.pk

    def test_the_package_digest_covers_paths_modes_and_content(self):
        base = packaging.SkillPackage(b"x", (packaging.PackageFile("a", b"1"),))
        assert (
            base.sha256() != packaging.SkillPackage(b"x", (packaging.PackageFile("a", b"1", True),)).sha256()
        )
        assert base.sha256() != packaging.SkillPackage(b"x", (packaging.PackageFile("b", b"1"),)).sha256()
        assert base.sha256() != packaging.SkillPackage(b"x1", (packaging.PackageFile("a", b""),)).sha256()


class TestSkillMdValidation:
    @pytest.mark.parametrize(
        "text, field",
        [
            (skill_md("Bad_Name"), "name"),
            (skill_md("-bad"), "name"),
            (skill_md("bad--name"), "name"),
            (skill_md("a" * 65), "name"),
            (skill_md("café"), "name"),
            ("---\ndescription: no name\n---\n", "name"),
            (skill_md(description='""'), "description"),
            (skill_md(description="x" * 1025), "description"),
            ("---\nname: demo-skill\n---\n", "description"),
            (skill_md(extra="version: 1\n"), "frontmatter"),
            (skill_md(extra="name: again\n"), "frontmatter"),
            (skill_md(extra="compatibility: " + "c" * 501 + "\n"), "compatibility"),
            # Longer than their columns: refused with the field, never a database error.
            (skill_md(extra="license: " + "l" * 501 + "\n"), "license"),
            (skill_md(extra="allowed-tools: " + "t " * 1001 + "\n"), "allowed-tools"),
            (skill_md(extra="metadata: [a, b]\n"), "metadata"),
            (skill_md(extra="metadata:\n  version: 1.0\n"), "metadata"),
            (skill_md(extra="license: [MIT]\n"), "license"),
            (skill_md(extra="allowed-tools: {a: b}\n"), "allowed-tools"),
            ("# no frontmatter\n", "frontmatter"),
            ("---\nname: demo-skill\n", "frontmatter"),
            ("---\n: : :\n---\n", "frontmatter"),
            ("---\n- a list\n---\n", "frontmatter"),
            # QA findings: NUL (PostgreSQL text refuses it), a BOM, a frontmatter too big to parse.
            (skill_md(body="bo\x00dy"), "skill_md"),
            (skill_md(description='"a\\0b"'), "description"),
            (skill_md(extra='metadata:\n  a: "b\\0c"\n'), "metadata"),
            ("\ufeff" + skill_md(), "frontmatter"),
            (skill_md(extra="".join(f"k{i}: v\n" for i in range(8000))), "frontmatter"),
            (skill_md("yes"), "name"),
            (skill_md(description="2024-01-01"), "description"),
            (skill_md(extra="metadata: " + "[" * 2000 + "]" * 2000 + "\n"), "frontmatter"),
        ],
    )
    def test_it_refuses_naming_the_field(self, text, field):
        error = refusal(packaging.parse_skill_md, text.encode())

        assert field in error.errors, error.errors
        assert str(error).startswith(f"{list(error.errors)[0]}: ")

    def test_messages_quote_little_of_what_they_refuse(self):
        many = refusal(
            packaging.parse_skill_md, skill_md(extra="".join(f"k{i}: v\n" for i in range(200))).encode()
        )
        assert "and 190 more" in str(many) and len(str(many)) < 600
        huge_key = refusal(packaging.parse_skill_md, skill_md(extra="x" * 50_000 + ": [\n").encode())
        assert len(str(huge_key)) < 800

    def test_it_refuses_what_is_not_utf8(self):
        error = refusal(packaging.parse_skill_md, skill_md().encode("utf-16"))
        assert list(error.errors) == ["skill_md"]

    def test_the_folder_name_must_be_the_skill_name(self, tmp_path):
        (tmp_path / "other").mkdir()
        (tmp_path / "other/SKILL.md").write_text(skill_md("demo-skill"))

        error = refusal(packaging.validate_package, packaging.read_folder(tmp_path / "other"))

        assert "must equal the skill's folder name" in error.errors["name"][0]

    def test_crlf_and_empty_optional_fields_are_fine(self):
        parsed = packaging.parse_skill_md(skill_md(extra="license:\n").replace("\n", "\r\n").encode())
        assert parsed.name == "demo-skill" and parsed.license == "" and parsed.body == "# Demo\r\n\r\nDo it."


class TestZipReader:
    def test_files_at_the_root_are_accepted(self):
        package = packaging.read_zip(make_zip({"SKILL.md": skill_md(), "scripts/a.py": "print(1)\n"}))
        assert package.folder is None and [f.path for f in package.files] == ["scripts/a.py"]

    def test_macos_litter_is_ignored(self):
        package = packaging.read_zip(
            make_zip(
                {
                    "demo-skill/SKILL.md": skill_md(),
                    "demo-skill/.DS_Store": b"\0",
                    "__MACOSX/demo-skill/._SKILL.md": b"\0",
                }
            )
        )
        assert package.folder == "demo-skill" and package.files == ()

    def test_the_top_folder_must_be_the_skill_name(self, tenant_a):
        package = packaging.read_zip(make_zip({"wrong/SKILL.md": skill_md()}))
        error = refusal(packaging.import_package, package, tenant=tenant_a)
        assert "name" in error.errors

    @pytest.mark.parametrize(
        "entry, words",
        [
            ("demo-skill/../x", "escapes the skill folder"),
            ("../x", "escapes the skill folder"),
            ("/etc/passwd", "absolute path"),
            ("C:/x", "absolute path"),
            ("demo-skill\\x", "backslash"),
        ],
    )
    def test_escaping_entries_are_refused(self, entry, words):
        data = make_zip({"demo-skill/SKILL.md": skill_md(), entry: "x"})

        error = refusal(packaging.read_zip, data)

        assert list(error.errors) == ["archive"] and words in error.errors["archive"][0]
        assert str(error) == f"archive: entry {entry} {error.errors['archive'][0].split(entry + ' ', 1)[1]}"

    def test_symlink_entries_are_refused(self):
        error = refusal(packaging.read_zip, symlink_zip())
        assert "symbolic link" in error.errors["archive"][0]

    def test_other_special_entries_are_refused(self):
        data = make_zip({"SKILL.md": skill_md(), "fifo": ""}, modes={"fifo": stat.S_IFIFO | 0o644})
        assert "not a regular file" in refusal(packaging.read_zip, data).errors["archive"][0]

    @pytest.mark.parametrize("data", [b"not a zip", b"PK\x03\x04" + b"\0" * 40, b""])
    def test_corrupt_zips_are_refused(self, data):
        assert list(refusal(packaging.read_zip, data).errors) == ["archive"]

    def test_every_single_byte_damage_is_read_or_refused_never_a_crash(self, tenant_a):
        skill = import_folder(FIXTURES / "pdf-report", tenant_a).skill
        for base in (make_zip({"SKILL.md": skill_md() * 20}), packaging.export_zip(skill)):
            for index in range(len(base)):
                damaged = bytearray(base)
                damaged[index] ^= 0xFF
                try:
                    packaging.read_zip(bytes(damaged))
                except SkillPackageError:
                    pass

    def test_a_missing_skill_md_is_refused(self):
        error = refusal(packaging.read_zip, make_zip({"demo-skill/README.md": "hi"}))
        assert list(error.errors) == ["skill_md"]

    def test_several_top_folders_are_refused(self):
        error = refusal(packaging.read_zip, make_zip({"a/SKILL.md": skill_md(), "b/x": "y"}))
        assert "one top-level folder" in error.errors["archive"][0]

    def test_too_many_files_are_refused(self, settings):
        settings.XAGENT_SKILL_MAX_FILES = 3
        data = make_zip({"SKILL.md": skill_md(), **{f"f{i}": "x" for i in range(3)}})
        error = refusal(packaging.read_zip, data)
        assert "XAGENT_SKILL_MAX_FILES" in error.errors["files"][0]

    def test_a_zip_bomb_is_refused(self):
        data = make_zip({"SKILL.md": skill_md(), "zeros": b"\0" * (6 * 1024 * 1024)})
        assert len(data) < 100_000
        error = refusal(packaging.read_zip, data)
        assert "XAGENT_SKILL_MAX_BYTES" in error.errors["files"][0]

    @pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
    def test_entries_compressed_other_than_deflate_are_refused_before_decompressing(self, method):
        # zipfile bounds one read's output only for deflate: a bzip2 entry of a few hundred bytes
        # could expand to gigabytes in one read, before any budget counts it.
        data = make_zip({"SKILL.md": skill_md(), "zeros": b"\0" * 1024}, method=method)
        error = refusal(packaging.read_zip, data)
        assert "compression method" in error.errors["archive"][0]

    def test_a_zip_whose_headers_understate_sizes_is_refused(self, settings):
        settings.XAGENT_SKILL_MAX_BYTES = 10_000
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("SKILL.md", skill_md())
            archive.writestr("zeros", b"\0" * 50_000)
        data = bytearray(buffer.getvalue())
        # Rewrite the declared uncompressed size of "zeros" (local and central headers) to 10 bytes.
        for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
            start = 0
            while (found := data.find(signature, start)) != -1:
                name_at = found + (30 if signature == b"PK\x03\x04" else 46)
                if data[name_at : name_at + 5] == b"zeros":
                    struct.pack_into("<I", data, found + offset, 10)
                start = found + 4
        error = refusal(packaging.read_zip, bytes(data))
        assert set(error.errors) <= {"archive", "files"}


class TestFolderReader:
    def test_a_symlink_inside_the_folder_is_refused_and_not_followed(self, tmp_path):
        folder = tmp_path / "demo-skill"
        folder.mkdir()
        (folder / "SKILL.md").write_text(skill_md())
        (folder / "secret").symlink_to("/etc/passwd")

        error = refusal(packaging.read_folder, folder)

        assert "secret is a symbolic link" in error.errors["files"][0]

    def test_a_symlinked_directory_is_refused(self, tmp_path):
        folder = tmp_path / "demo-skill"
        folder.mkdir()
        (folder / "SKILL.md").write_text(skill_md())
        (folder / "etc").symlink_to("/etc", target_is_directory=True)
        assert "etc is a symbolic link" in refusal(packaging.read_folder, folder).errors["files"][0]

    def test_a_fifo_is_refused(self, tmp_path):
        folder = tmp_path / "demo-skill"
        folder.mkdir()
        (folder / "SKILL.md").write_text(skill_md())
        os.mkfifo(folder / "pipe")
        assert "not a regular file" in refusal(packaging.read_folder, folder).errors["files"][0]

    def test_limits_apply(self, tmp_path, settings):
        folder = tmp_path / "demo-skill"
        folder.mkdir()
        (folder / "SKILL.md").write_text(skill_md())
        (folder / "big").write_bytes(b"x" * 2000)
        settings.XAGENT_SKILL_MAX_BYTES = 1000
        assert "XAGENT_SKILL_MAX_BYTES" in refusal(packaging.read_folder, folder).errors["files"][0]
        settings.XAGENT_SKILL_MAX_BYTES = 10_000
        settings.XAGENT_SKILL_MAX_FILES = 1
        assert "XAGENT_SKILL_MAX_FILES" in refusal(packaging.read_folder, folder).errors["files"][0]

    def test_a_missing_skill_md_is_refused(self, tmp_path):
        (tmp_path / "demo-skill").mkdir()
        assert list(refusal(packaging.read_folder, tmp_path / "demo-skill").errors) == ["skill_md"]


def test_a_refused_import_writes_nothing(tenant_a):
    with pytest.raises(SkillPackageError):
        packaging.import_package(packaging.read_skill_md(skill_md("Bad")), tenant=tenant_a)
    assert not Skill.objects.exists() and not SkillVersion.objects.exists() and not SkillFile.objects.exists()


def test_the_demo_copies_match_the_test_fixtures():
    from pathlib import Path

    import skills_app

    demo = Path(skills_app.__file__).parent / "demo_data" / "skills"
    for name in FIXTURE_NAMES:
        assert folder_files(demo / name) == folder_files(FIXTURES / name), name
