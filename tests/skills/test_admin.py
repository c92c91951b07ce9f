"""Skills in admin: import form (zip or pasted SKILL.md) with field-named errors and nothing
saved on refusal, tenant scoping (owner_a is tenant A's admin), new versions, enable/disable,
export action, sanitized preview."""

from __future__ import annotations

import io
import zipfile

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from skills_app import packaging
from skills_app.models import Skill, SkillVersion

from ..factories import UserFactory
from .helpers import FIXTURES, make_zip, skill_md, symlink_zip

pytestmark = pytest.mark.django_db
ADMIN = "/admin/skills_app/skill"


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def root(db):
    return client_for(UserFactory(username="root", is_staff=True, is_superuser=True))


@pytest.fixture
def tenant_admin(owner_a):
    assert owner_a.is_staff and not owner_a.is_superuser
    return client_for(owner_a)


def fixture_zip(name: str, tenant=None) -> bytes:
    skill = packaging.import_package(packaging.read_folder(FIXTURES / name), tenant=tenant).skill
    data = packaging.export_zip(skill)
    packaging.delete_skills([skill])
    return data


def upload(data: bytes, name="skill.zip"):
    return SimpleUploadedFile(name, data, content_type="application/zip")


def form_errors(response) -> dict[str, list[str]]:
    assert response.status_code == 200, response.status_code  # the form again, not a redirect
    return {field: list(errors) for field, errors in response.context["adminform"].form.errors.items()}


def add(tenant, name, body="# Body\n"):
    return packaging.import_package(packaging.read_skill_md(skill_md(name, body=body)), tenant=tenant).skill


class TestImportForm:
    def test_a_tenant_admin_imports_a_zip_into_their_tenant(self, tenant_admin, tenant_a, owner_a):
        response = tenant_admin.post(
            f"{ADMIN}/add/", {"tenant": tenant_a.pk, "archive": upload(fixture_zip("pdf-report"))}
        )

        assert response.status_code == 302, form_errors(response)
        skill = Skill.objects.get()
        assert (skill.tenant, skill.name, skill.version) == (tenant_a, "pdf-report", 1)
        version = skill.current_version
        assert version.origin == "zip" and version.created_by == "owner_a" and version.files.count() == 3

    def test_a_superuser_imports_a_pasted_skill_md_as_global(self, root):
        text = (FIXTURES / "research-guide/SKILL.md").read_text().replace("\n", "\r\n")

        response = root.post(f"{ADMIN}/add/", {"tenant": "", "skill_md": text})

        assert response.status_code == 302, form_errors(response)
        skill = Skill.objects.get()
        assert skill.tenant_id is None and skill.current_version.origin == "paste"
        assert bytes(skill.current_version.skill_md) == (FIXTURES / "research-guide/SKILL.md").read_bytes()

    @pytest.mark.parametrize("persona", ["root", "tenant_admin"])
    @pytest.mark.parametrize(
        "data, field, expected",
        [
            (make_zip({"demo-skill/SKILL.md": skill_md(), "demo-skill/../x": "x"}), "archive", "archive: entry demo-skill/../x escapes the skill folder"),
            (make_zip({"SKILL.md": skill_md(), "/etc/x": "x"}), "archive", "archive: entry /etc/x is an absolute path"),
            (symlink_zip(), "archive", "archive: entry demo-skill/link is a symbolic link; symlinks are refused"),
            (b"this is not a zip", "archive", "archive: not a readable zip file"),
            (make_zip({"demo-skill/notes.md": "x"}), "archive", "skill_md: no SKILL.md in the folder demo-skill of the skill"),
            (make_zip({"demo-skill/SKILL.md": skill_md(extra="tags: [a]\n")}), "archive", "frontmatter: unknown field(s) tags"),
            (skill_md("Not_Valid"), "skill_md", "name: 'Not_Valid': use lowercase letters"),
            (skill_md(description='""'), "skill_md", "description: must not be empty"),
            (skill_md(extra="colour: blue\n"), "skill_md", "frontmatter: unknown field(s) colour"),
        ],
    )  # fmt: skip
    def test_refusals_name_the_field_and_save_nothing(
        self, request, persona, data, field, expected, tenant_a
    ):
        client = request.getfixturevalue(persona)
        payload = {"tenant": tenant_a.pk}
        payload[field] = upload(data) if field == "archive" else data

        errors = form_errors(client.post(f"{ADMIN}/add/", payload))

        assert any(message.startswith(expected) for message in errors.get(field, [])), errors
        assert not Skill.objects.exists() and not SkillVersion.objects.exists()

    def test_oversize_and_too_many_files(self, root, tenant_a, settings):
        data = fixture_zip("pdf-report")
        settings.XAGENT_SKILL_MAX_FILES = 2
        errors = form_errors(root.post(f"{ADMIN}/add/", {"tenant": tenant_a.pk, "archive": upload(data)}))
        assert errors["archive"][0].startswith("files: the skill has more than 2 files")
        settings.XAGENT_SKILL_MAX_FILES = 100
        settings.XAGENT_SKILL_MAX_BYTES = 1000
        errors = form_errors(
            root.post(f"{ADMIN}/add/", {"tenant": tenant_a.pk, "skill_md": skill_md(body="x" * 2000)})
        )
        assert errors["skill_md"][0].startswith("files: the skill is larger than 1000 bytes")
        assert not Skill.objects.exists()

    def test_a_tenant_admin_must_pick_one_of_their_tenants(self, tenant_admin, tenant_b):
        for tenant in ("", tenant_b.pk):
            errors = form_errors(
                tenant_admin.post(f"{ADMIN}/add/", {"tenant": tenant, "skill_md": skill_md()})
            )
            assert "tenant" in errors
        assert not Skill.objects.exists()

    def test_one_source_only(self, root, tenant_a):
        errors = form_errors(root.post(f"{ADMIN}/add/", {"tenant": tenant_a.pk}))
        assert errors["__all__"] == ["Upload a zip or paste a SKILL.md."]
        errors = form_errors(
            root.post(
                f"{ADMIN}/add/",
                {"tenant": tenant_a.pk, "skill_md": skill_md(), "archive": upload(symlink_zip())},
            )
        )
        assert "not both" in errors["skill_md"][0]

    def test_an_existing_name_is_refused_in_the_add_form(self, root, tenant_a):
        add(tenant_a, "demo-skill")
        errors = form_errors(root.post(f"{ADMIN}/add/", {"tenant": tenant_a.pk, "skill_md": skill_md()}))
        assert "already exists" in errors["skill_md"][0]


class TestScoping:
    def test_a_tenant_admin_sees_own_and_global_never_another_tenants(self, tenant_admin, tenant_a, tenant_b):
        own, shared, foreign = (
            add(tenant_a, "own-skill"),
            add(None, "shared-skill"),
            add(tenant_b, "bravo-skill"),
        )

        response = tenant_admin.get(f"{ADMIN}/")

        assert set(response.context["cl"].result_list) == {own, shared}
        assert "bravo" not in response.content.decode().lower()
        assert (
            tenant_admin.get(f"{ADMIN}/{foreign.pk}/change/").status_code == 302
        )  # "does not exist" redirect
        assert not Skill.objects.filter(pk=foreign.pk, enabled=False).exists()

    def test_a_tenant_admin_cannot_change_a_global_skill(self, tenant_admin, tenant_a):
        shared = add(None, "shared-skill")

        page = tenant_admin.get(f"{ADMIN}/{shared.pk}/change/")
        assert page.status_code == 200 and "new_skill_md" not in page.content.decode()
        response = tenant_admin.post(
            f"{ADMIN}/{shared.pk}/change/",
            {"enabled": "", "new_skill_md": skill_md("shared-skill", body="evil")},
        )
        assert response.status_code == 403
        tenant_admin.post(f"{ADMIN}/", {"action": "disable_selected", "_selected_action": [shared.pk]})
        shared.refresh_from_db()
        assert shared.enabled and shared.version == 1

    def test_the_source_filter(self, root, tenant_a):
        own, shared = add(tenant_a, "own-skill"), add(None, "shared-skill")
        assert list(root.get(f"{ADMIN}/?source=global").context["cl"].result_list) == [shared]
        assert list(root.get(f"{ADMIN}/?source=tenant").context["cl"].result_list) == [own]
        assert list(root.get(f"{ADMIN}/?q=Body").context["cl"].result_list) == [own, shared]


class TestChangeView:
    def test_a_pasted_new_version_keeps_the_files_and_the_history(self, tenant_admin, tenant_a):
        skill = packaging.import_package(
            packaging.read_folder(FIXTURES / "pdf-report"), tenant=tenant_a
        ).skill
        text = (FIXTURES / "pdf-report/SKILL.md").read_text().replace("two pages", "three pages")

        response = tenant_admin.post(f"{ADMIN}/{skill.pk}/change/", {"enabled": "on", "new_skill_md": text})

        assert response.status_code == 302, form_errors(response)
        skill.refresh_from_db()
        assert skill.version == 2 and "three pages" in skill.body
        assert skill.current_version.files.count() == 3 and skill.versions.count() == 2

    def test_a_new_version_must_keep_the_name(self, tenant_admin, tenant_a):
        skill = add(tenant_a, "demo-skill")
        errors = form_errors(
            tenant_admin.post(
                f"{ADMIN}/{skill.pk}/change/", {"enabled": "on", "new_skill_md": skill_md("renamed")}
            )
        )
        assert errors["new_skill_md"][0].startswith("name: a new version must keep the name 'demo-skill'")
        errors = form_errors(
            tenant_admin.post(
                f"{ADMIN}/{skill.pk}/change/",
                {"enabled": "on", "new_archive": upload(make_zip({"renamed/SKILL.md": skill_md("renamed")}))},
            )
        )
        assert errors["new_archive"][0].startswith("name: a new version must keep the name")
        assert skill.versions.count() == 1

    def test_enabled_is_the_one_editable_field(self, tenant_admin, tenant_a):
        skill = add(tenant_a, "demo-skill")
        response = tenant_admin.post(
            f"{ADMIN}/{skill.pk}/change/", {"enabled": "", "name": "renamed", "description": "changed"}
        )
        assert response.status_code == 302
        skill.refresh_from_db()
        assert (skill.enabled, skill.name, skill.description, skill.version) == (
            False,
            "demo-skill",
            "Does a demo thing.",
            1,
        )

    def test_the_preview_is_sanitized_and_versions_are_listed(self, tenant_admin, tenant_a):
        body = (
            "# Title\n\n<script>alert(1)</script>\n\n[x](javascript:alert(2)) <img src=x onerror=alert(3)>\n"
        )
        skill = packaging.import_package(
            packaging.read_zip(
                make_zip(
                    {
                        "evil-skill/SKILL.md": skill_md("evil-skill", body=body),
                        "evil-skill/scripts/a.sh": "#!/bin/sh\n",
                    }
                )
            ),
            tenant=tenant_a,
            by="alice",
            origin="zip",
        ).skill

        html = tenant_admin.get(f"{ADMIN}/{skill.pk}/change/").content.decode()

        preview = html.split('class="skill-body-preview">', 1)[1].split("</div>", 1)[0]
        assert "<h1>Title</h1>" in preview
        # Raw HTML and javascript: links come out as inert text, never as tags or attributes.
        assert "&lt;script&gt;" in preview and "<script" not in preview
        assert "href" not in preview and "onerror=" not in preview.replace("&lt;img src=x onerror=", "")
        assert "<img" not in preview
        assert skill.current_version.sha256 in html and "scripts/a.sh" in html and "alice" in html


class TestActions:
    def test_export_one_skill_imports_again_unchanged(self, tenant_admin, tenant_a):
        skill = packaging.import_package(
            packaging.read_folder(FIXTURES / "csv-cleanup"), tenant=tenant_a
        ).skill

        response = tenant_admin.post(
            f"{ADMIN}/", {"action": "export_selected", "_selected_action": [skill.pk]}
        )

        assert response["Content-Type"] == "application/zip"
        assert 'filename="csv-cleanup.zip"' in response["Content-Disposition"]
        again = packaging.import_package(packaging.read_zip(response.content), tenant=tenant_a)
        assert again.status == "unchanged" and again.skill.pk == skill.pk

    def test_export_several_gives_one_folder_each(self, root, tenant_a):
        skills = [
            packaging.import_package(packaging.read_folder(FIXTURES / n), tenant=tenant_a).skill
            for n in ("pdf-report", "research-guide")
        ]
        response = root.post(
            f"{ADMIN}/", {"action": "export_selected", "_selected_action": [s.pk for s in skills]}
        )
        names = zipfile.ZipFile(io.BytesIO(response.content)).namelist()
        assert {n.split("/")[0] for n in names} == {"pdf-report", "research-guide"}

    def test_exporting_ids_this_admin_cannot_see_gives_no_zip(self, tenant_admin, tenant_b):
        theirs = add(tenant_b, "bravo-skill")
        response = tenant_admin.post(
            f"{ADMIN}/", {"action": "export_selected", "_selected_action": [theirs.pk]}
        )
        assert response.status_code == 302 and response.get("Content-Type", "").startswith("text/html")
        shown = [str(m) for m in get_messages(response.wsgi_request)]
        assert shown == ["None of the selected Skills can be exported."]

    def test_a_crafted_selection_is_refused_not_a_500(self, tenant_admin):
        for ids in (["abc"], ["1 OR 1=1"]):
            response = tenant_admin.post(f"{ADMIN}/", {"action": "export_selected", "_selected_action": ids})
            assert response.status_code in (200, 302), response.status_code
            shown = [str(m) for m in get_messages(response.wsgi_request)]
            assert "The selection was not valid; nothing was changed." in shown

    def test_enable_and_disable(self, tenant_admin, tenant_a):
        skill = add(tenant_a, "demo-skill")
        tenant_admin.post(f"{ADMIN}/", {"action": "disable_selected", "_selected_action": [skill.pk]})
        skill.refresh_from_db()
        assert not skill.enabled
        tenant_admin.post(f"{ADMIN}/", {"action": "enable_selected", "_selected_action": [skill.pk]})
        skill.refresh_from_db()
        assert skill.enabled


def test_the_pages_render(root, tenant_a):
    skill = packaging.import_package(packaging.read_folder(FIXTURES / "pdf-report"), tenant=tenant_a).skill
    add_page = root.get(f"{ADMIN}/add/").content.decode()
    assert 'enctype="multipart/form-data"' in add_page and 'name="skill_md"' in add_page
    change_page = root.get(f"{ADMIN}/{skill.pk}/change/").content.decode()
    assert 'name="new_archive"' in change_page and 'name="enabled"' in change_page
    assert 'name="description"' not in change_page  # the projection is read-only
    listing = root.get(f"{ADMIN}/").content.decode()
    assert "pdf-report" in listing and "acme" in listing


def test_a_pasted_skill_md_over_the_body_limit_gets_a_page_that_says_so(root, tenant_a, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    response = root.post(
        f"{ADMIN}/add/", {"tenant": tenant_a.pk, "skill_md": skill_md(body="x" * 60_000)}, follow=False
    )
    assert response.status_code == 413
    page = response.content.decode()
    assert "too large" in page and "0.0 MB" not in page and "XAGENT_MAX_BODY_BYTES" in page
    assert not Skill.objects.exists()
