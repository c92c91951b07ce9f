"""The workspace over HTTP (CONTRACT: `/sessions/{id}/files/…`, `/deliveries/`).

alice (owner_a) uploads and reads her Session's files; charlie (outsider_b) of tenant B gets
404 everywhere; every path trick answers 400 `path_escape` in the error shape; limits answer
413/400 with clear messages.
"""

from __future__ import annotations

import io
import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from sessions_app.models import Input, SessionEvent
from sessions_app.runtime import engine

from ..tenancy.isolation import assert_error_shape

SESSIONS = "/api/v1/sessions/"


@pytest.fixture
def session_a(tenant_a, owner_a):
    return engine.create_session(tenant=tenant_a, owner=owner_a, title="files")


@pytest.fixture
def workspace(session_a):
    return engine.workspace_path(session_a)


def files_url(session, path: str = "") -> str:
    return f"{SESSIONS}{session.pk}/files/{path}"


def upload(client, session, name: str, content: bytes, path: str | None = None):
    body = {"file": SimpleUploadedFile(name, content)}
    if path is not None:
        body["path"] = path
    return client.post(files_url(session), body, format="multipart")


def file_events(session):
    return list(
        SessionEvent.objects.filter(session=session, type="file.changed")
        .order_by("seq")
        .values_list("data", flat=True)
    )


class TestUpload:
    def test_it_stores_the_file_and_announces_who_uploaded_it(
        self, api_owner_a, session_a, workspace, owner_a
    ):
        response = upload(api_owner_a, session_a, "tickets.csv", b"a,b\n1,2\n")

        assert response.status_code == 201, response.content
        assert response.json() == {
            "path": "tickets.csv",
            "size": 8,
            "op": "created",
            "name_changed": False,
            "requested_name": "tickets.csv",
            "name_change_reason": None,
        }
        assert (workspace / "tickets.csv").read_bytes() == b"a,b\n1,2\n"
        assert file_events(session_a) == [{"path": "tickets.csv", "op": "created", "by": owner_a.username}]

    def test_a_path_ending_in_a_slash_is_the_directory_to_put_it_in(self, api_owner_a, session_a, workspace):
        response = upload(api_owner_a, session_a, "t.csv", b"x", path="data/in/")

        assert response.status_code == 201
        assert response.json()["path"] == "data/in/t.csv"
        assert (workspace / "data" / "in" / "t.csv").read_bytes() == b"x"

    def test_uploading_again_replaces_the_file(self, api_owner_a, session_a, workspace):
        upload(api_owner_a, session_a, "notes.md", b"one")
        response = upload(api_owner_a, session_a, "notes.md", b"two!")

        body = response.json()
        assert (body["path"], body["size"], body["op"]) == ("notes.md", 4, "modified")
        assert (workspace / "notes.md").read_bytes() == b"two!"

    def test_an_upload_is_attachable_to_the_next_input(self, api_owner_a, session_a):
        upload(api_owner_a, session_a, "tickets.csv", b"a\n")

        response = api_owner_a.post(
            f"{SESSIONS}{session_a.pk}/inputs/",
            {"text": "use it", "attachments": ["./tickets.csv"]},
            format="json",
        )

        assert response.status_code == 202
        assert Input.objects.get(pk=response.json()["input_id"]).payload["attachments"] == ["tickets.csv"]

    def test_without_a_file_it_is_400_naming_the_field(self, api_owner_a, session_a):
        response = api_owner_a.post(files_url(session_a), {"path": "x.txt"}, format="multipart")

        assert "file" in assert_error_shape(response, 400, "validation_error")["details"]

    def test_a_json_body_is_415(self, api_owner_a, session_a):
        response = api_owner_a.post(files_url(session_a), {"file": "x"}, format="json")

        assert_error_shape(response, 415, "unsupported_media_type")

    def test_onto_a_directory_it_is_400(self, api_owner_a, session_a, workspace):
        (workspace / "dir").mkdir()

        response = upload(api_owner_a, session_a, "x.txt", b"x", path="dir")

        assert_error_shape(response, 400, "is_a_directory")


class TestLimits:
    def test_a_file_over_the_upload_limit_is_413_and_nothing_is_written(
        self, api_owner_a, session_a, workspace, settings
    ):
        settings.XAGENT_UPLOAD_MAX_BYTES = 1000

        response = upload(api_owner_a, session_a, "big.bin", b"x" * 1001)

        error = assert_error_shape(response, 413, "file_too_large")
        assert "1,000-byte upload limit" in error["message"]
        assert error["details"] == {"size": 1001, "limit_bytes": 1000}
        assert not (workspace / "big.bin").exists()
        assert file_events(session_a) == []

    def test_a_declared_body_far_over_the_limit_is_413_before_it_is_parsed(
        self, api_owner_a, session_a, settings
    ):
        settings.XAGENT_UPLOAD_MAX_BYTES = 1000

        response = upload(api_owner_a, session_a, "big.bin", b"x" * 200_000)

        error = assert_error_shape(response, 413, "file_too_large")
        assert error["details"]["limit_bytes"] == 1000 and error["details"]["content_length"] > 200_000

    def test_a_full_workspace_is_413(self, api_owner_a, session_a, workspace, settings):
        settings.XAGENT_WORKSPACE_MAX_BYTES = 100
        (workspace / "old.bin").write_bytes(b"x" * 90)

        response = upload(api_owner_a, session_a, "new.bin", b"y" * 20)

        error = assert_error_shape(response, 413, "workspace_full")
        assert error["details"]["limit_bytes"] == 100
        # Replacing a file counts what it frees.
        assert upload(api_owner_a, session_a, "old.bin", b"z" * 95).status_code == 201

    def test_too_many_files_is_400(self, api_owner_a, session_a, workspace, settings):
        settings.XAGENT_WORKSPACE_MAX_FILES = 2
        (workspace / "a").write_text("a")
        (workspace / "b").write_text("b")

        response = upload(api_owner_a, session_a, "c", b"c")

        assert_error_shape(response, 400, "too_many_files")
        assert upload(api_owner_a, session_a, "a", b"replaced").status_code == 201


class TestTreeAndContent:
    def test_the_tree_lists_files_and_directories(self, api_owner_a, session_a, workspace):
        (workspace / "out").mkdir()
        (workspace / "out" / "report.html").write_text("<h1>r</h1>")
        (workspace / "kpis.csv").write_text("metric,value\n")

        response = api_owner_a.get(files_url(session_a))

        assert response.status_code == 200
        rows = response.json()
        assert [(r["path"], r["kind"], r["size"]) for r in rows] == [
            ("kpis.csv", "file", 13),
            ("out", "dir", 0),
            ("out/report.html", "file", 10),
        ]
        assert all(r["modified_at"] for r in rows)

    def test_the_bytes_come_with_their_type_and_a_sandboxing_policy(self, api_owner_a, session_a, workspace):
        (workspace / "report.html").write_text("<h1>Report</h1>")

        response = api_owner_a.get(files_url(session_a, "report.html"))

        assert response.status_code == 200
        assert b"".join(response.streaming_content) == b"<h1>Report</h1>"
        assert response["Content-Type"] == "text/html; charset=utf-8"
        assert response["Content-Disposition"].startswith("inline")
        csp = response["Content-Security-Policy"]
        assert csp.startswith("sandbox;") and "allow-" not in csp and "script-src" not in csp
        assert "default-src 'none'" in csp
        assert response["X-Content-Type-Options"] == "nosniff"

    def test_scripts_run_only_when_asked_and_still_sandboxed(self, api_owner_a, session_a, workspace):
        (workspace / "chart.html").write_text("<script>document.title='x'</script>")

        csp = api_owner_a.get(files_url(session_a, "chart.html") + "?scripts=1")["Content-Security-Policy"]

        assert csp.startswith("sandbox allow-scripts;") and "allow-same-origin" not in csp
        assert "script-src 'unsafe-inline'" in csp and "default-src 'none'" in csp

    def test_download_forces_an_attachment(self, api_owner_a, session_a, workspace):
        (workspace / "kpis.csv").write_text("metric,value\n")

        response = api_owner_a.get(files_url(session_a, "kpis.csv") + "?download=1")

        assert response["Content-Disposition"] == 'attachment; filename="kpis.csv"'
        assert response["Content-Type"].startswith("text/csv")

    def test_an_unknown_kind_is_octet_stream(self, api_owner_a, session_a, workspace):
        (workspace / "blob.xyz").write_bytes(b"\x00\x01")

        response = api_owner_a.get(files_url(session_a, "blob.xyz"), HTTP_ACCEPT="image/png")

        assert response.status_code == 200
        assert response["Content-Type"] == "application/octet-stream"

    def test_a_missing_file_is_404(self, api_owner_a, session_a):
        assert_error_shape(
            api_owner_a.get(files_url(session_a, "nope.txt"), HTTP_ACCEPT="text/html"), 404, "not_found"
        )

    def test_a_directory_is_400(self, api_owner_a, session_a, workspace):
        (workspace / "d").mkdir()

        assert_error_shape(api_owner_a.get(files_url(session_a, "d")), 400, "is_a_directory")


class TestDelete:
    def test_a_person_deletes_a_file_and_it_is_audited(self, api_owner_a, session_a, workspace, owner_a):
        (workspace / "draft.md").write_text("x")

        response = api_owner_a.delete(files_url(session_a, "draft.md"))

        assert response.status_code == 204
        assert not (workspace / "draft.md").exists()
        assert file_events(session_a) == [{"path": "draft.md", "op": "deleted", "by": owner_a.username}]

    def test_a_directory_goes_with_its_content(self, api_owner_a, session_a, workspace):
        (workspace / "d" / "e").mkdir(parents=True)
        (workspace / "d" / "e" / "f.txt").write_text("x")

        assert api_owner_a.delete(files_url(session_a, "d")).status_code == 204
        assert not (workspace / "d").exists()

    def test_a_symlink_is_removed_not_what_it_points_to(self, api_owner_a, session_a, workspace, tmp_path):
        outside = tmp_path / "precious.txt"
        outside.write_text("keep")
        os.symlink(outside, workspace / "link")

        assert api_owner_a.delete(files_url(session_a, "link")).status_code == 204
        assert outside.read_text() == "keep"
        assert not os.path.lexists(workspace / "link")

    def test_the_workspace_itself_cannot_be_deleted(self, api_owner_a, session_a, workspace):
        assert_error_shape(api_owner_a.delete(files_url(session_a, ".")), 400, "invalid_path")
        assert workspace.is_dir()

    def test_a_missing_file_is_404(self, api_owner_a, session_a):
        assert_error_shape(api_owner_a.delete(files_url(session_a, "nope")), 404, "not_found")


ESCAPES = [
    "../secret.txt",
    "%2e%2e/secret.txt",
    "a/../../secret.txt",
    "%2Fetc%2Fpasswd",
    "/etc/passwd",
    "link/secret.txt",
]


class TestPathEscapes:
    @pytest.fixture(autouse=True)
    def outside(self, workspace, tmp_path):
        (workspace.parent / "secret.txt").write_text("s3cret")
        (tmp_path / "secret.txt").write_text("s3cret")
        os.symlink(tmp_path, workspace / "link")
        yield
        (workspace.parent / "secret.txt").unlink()

    @pytest.mark.parametrize("path", ESCAPES)
    def test_reading_is_400(self, api_owner_a, session_a, path):
        response = api_owner_a.get(files_url(session_a, path))

        assert_error_shape(response, 400, "path_escape")
        assert b"s3cret" not in response.content

    @pytest.mark.parametrize("path", ESCAPES)
    def test_previewing_is_400(self, api_owner_a, session_a, path):
        assert_error_shape(api_owner_a.get(f"{SESSIONS}{session_a.pk}/previews/{path}"), 400, "path_escape")

    @pytest.mark.parametrize("path", ESCAPES)
    def test_deleting_is_400(self, api_owner_a, session_a, path, tmp_path, workspace):
        response = api_owner_a.delete(files_url(session_a, path))

        assert_error_shape(response, 400, "path_escape")
        assert (tmp_path / "secret.txt").exists() and (workspace.parent / "secret.txt").exists()

    @pytest.mark.parametrize("path", ["../x.txt", "/tmp/x.txt", "link/x.txt", "a/../../x.txt", "..", "link/"])
    def test_uploading_is_400(self, api_owner_a, session_a, path, tmp_path):
        response = upload(api_owner_a, session_a, "x.txt", b"x", path=path)

        assert_error_shape(response, 400, "path_escape")
        assert not (tmp_path / "x.txt").exists()

    @pytest.mark.parametrize("name", ["../../x.txt", "/tmp/x.txt"])
    def test_a_file_name_with_a_path_lands_in_the_workspace_by_its_base_name(
        self, api_owner_a, session_a, name, workspace
    ):
        response = upload(api_owner_a, session_a, name, b"x")

        assert response.status_code == 201
        assert response.json()["path"] == "x.txt"

    def test_attachments_use_the_same_rule(self, api_owner_a, session_a):
        response = api_owner_a.post(
            f"{SESSIONS}{session_a.pk}/inputs/",
            {"text": "x", "attachments": ["link/secret.txt"]},
            format="json",
        )

        details = assert_error_shape(response, 400, "validation_error")["details"]
        assert "outside the workspace" in str(details["attachments"])


class TestTenancy:
    def test_every_files_route_of_another_tenant_is_404(self, api_outsider_b, session_a, workspace):
        (workspace / "report.html").write_text("<h1>secret report</h1>")
        base = f"{SESSIONS}{session_a.pk}"

        for response in (
            api_outsider_b.get(files_url(session_a)),
            api_outsider_b.get(files_url(session_a, "report.html")),
            api_outsider_b.get(f"{base}/previews/report.html"),
            api_outsider_b.delete(files_url(session_a, "report.html")),
            upload(api_outsider_b, session_a, "x.txt", b"x"),
            api_outsider_b.get(f"{base}/deliveries/"),
            api_outsider_b.get(f"{base}/deliveries/1/"),
        ):
            assert_error_shape(response, 404, "not_found")
            assert b"secret report" not in response.content
        assert (workspace / "report.html").exists() and not (workspace / "x.txt").exists()

    def test_anonymous_is_401(self, api_anonymous, session_a):
        assert_error_shape(api_anonymous.get(files_url(session_a)), 401, "not_authenticated")
        assert_error_shape(api_anonymous.get(files_url(session_a, "x")), 401, "not_authenticated")


class TestPreviews:
    def preview(self, client, session, path):
        response = client.get(f"{SESSIONS}{session.pk}/previews/{path}")
        assert response.status_code == 200, response.content
        return response.json()

    def test_csv_is_a_table_with_counts(self, api_owner_a, session_a, workspace):
        (workspace / "t.csv").write_text("a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(150)))

        body = self.preview(api_owner_a, session_a, "t.csv")

        assert body["kind"] == "csv"
        assert body["header"] == ["a", "b"] and body["row_count"] == 150 and body["column_count"] == 2
        assert body["row_count_exact"] and not body["truncated"]
        assert len(body["rows"]) == 100 and body["rows"][0] == ["0", "0"]

    def test_a_csv_larger_than_a_preview_says_its_count_is_partial(self, api_owner_a, session_a, workspace):
        (workspace / "big.csv").write_text("n\n" + "".join(f"{i}\n" for i in range(100_000)))

        body = self.preview(api_owner_a, session_a, "big.csv")

        assert body["truncated"] and not body["row_count_exact"]
        assert 1000 < body["row_count"] < 100_000
        assert body["rows"][-1] == [str(len(body["rows"]) - 1)]

    def test_markdown_is_rendered_and_sanitized(self, api_owner_a, session_a, workspace):
        (workspace / "g.md").write_text(
            "# Guide\n\n<script>alert(1)</script>\n\n[x](javascript:alert(1)) **bold**\n\n<img src=x onerror=alert(1)>\n"
        )

        html = self.preview(api_owner_a, session_a, "g.md")["html"]

        assert "<h1>Guide</h1>" in html and "<strong>bold</strong>" in html
        # Raw HTML in Markdown shows as text; a javascript: link is not a link.
        assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
        assert "&lt;script&gt;" in html

    def test_text_and_the_kinds_the_browser_renders(self, api_owner_a, session_a, workspace):
        (workspace / "notes.txt").write_text("one\ntwo\n")
        (workspace / "README").write_text("plain\n")
        (workspace / "r.html").write_text("<p>x</p>")
        (workspace / "b.bin").write_bytes(b"\x00\xff" * 10)

        text = self.preview(api_owner_a, session_a, "notes.txt")
        assert text["text"] == "one\ntwo\n" and text["line_count"] == 2 and text["line_count_exact"]
        assert self.preview(api_owner_a, session_a, "README")["kind"] == "text"
        html = self.preview(api_owner_a, session_a, "r.html")
        assert html["kind"] == "html" and html["url"] == f"/api/v1/sessions/{session_a.pk}/files/r.html"
        assert html["scripts_url"] == html["url"] + "?scripts=1"
        (workspace / "logo.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
        assert self.preview(api_owner_a, session_a, "logo.svg")["kind"] == "image"
        assert self.preview(api_owner_a, session_a, "b.bin")["kind"] == "binary"

    def test_a_hostile_name_is_returned_as_data(self, api_owner_a, session_a, workspace):
        name = "<img src=x onerror=alert(1)>.html"
        (workspace / name).write_text("<p>x</p>")

        listed = api_owner_a.get(files_url(session_a)).json()

        assert listed[0]["path"] == name
        body = self.preview(
            api_owner_a, session_a, name.replace("<", "%3C").replace(">", "%3E").replace(" ", "%20")
        )
        assert body["path"] == name and body["url"].endswith(
            "%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E.html"
        )


def test_the_upload_form_body_streams_to_disk(api_owner_a, session_a, workspace, settings):
    # Larger than Django's in-memory threshold: the temporary-file handler is used, same result.
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1024
    data = os.urandom(300_000)

    response = upload(api_owner_a, session_a, "blob.bin", data)
    assert response.status_code == 201 and (workspace / "blob.bin").read_bytes() == data


class TestHostileNames:
    """Names a model or a shell may create, and names an attacker may send: 4xx, never a 500."""

    def test_a_control_character_in_a_name_never_reaches_a_header(self, api_owner_a, session_a, workspace):
        (workspace / "a\nb.txt").write_text("x")

        response = api_owner_a.get(files_url(session_a, "a%0Ab.txt"))

        assert response.status_code == 200
        assert response["Content-Disposition"] == 'inline; filename="a_b.txt"'
        assert api_owner_a.delete(files_url(session_a, "a%0Ab.txt")).status_code == 204

    def test_uploads_refuse_control_characters(self, api_owner_a, session_a):
        response = upload(api_owner_a, session_a, "n.txt", b"x", path="z\n.txt")

        assert "control or invisible" in assert_error_shape(response, 400, "invalid_path")["message"]

    @pytest.mark.parametrize("name", ["invoice\u202etxt.html", "a\u200bb.txt", "a\x85b.txt", "a\u2028b.txt"])
    def test_uploads_refuse_invisible_formatting_characters(self, api_owner_a, session_a, name):
        assert_error_shape(upload(api_owner_a, session_a, "ok.txt", b"x", path=name), 400, "invalid_path")
        # In the part's filename Django's multipart parser already drops them.
        landed = upload(api_owner_a, session_a, name, b"x")
        assert landed.status_code == 201 and landed.json()["path"].isprintable()

    @pytest.mark.parametrize(
        "path", ["skills/pdf-report/SKILL.md", "skills/", "./skills/x/y.txt", "a/../skills/z"]
    )
    def test_uploads_into_the_skills_folder_are_refused(self, api_owner_a, session_a, workspace, path):
        """skills/ is where the agent sees its loaded Skills, read-only: an upload there could
        pass for a Skill's file (QA)."""
        response = upload(api_owner_a, session_a, "SKILL.md", b"PLANTED", path=path)
        assert "skills/" in assert_error_shape(response, 400, "reserved_path")["message"]
        assert not (workspace / "skills").exists()

    def test_a_symlink_into_the_skills_folder_is_refused_too(self, api_owner_a, session_a, workspace):
        (workspace / "skills").mkdir()
        (workspace / "docs").symlink_to(workspace / "skills")
        assert_error_shape(
            upload(api_owner_a, session_a, "x.txt", b"x", path="docs/x.txt"), 400, "reserved_path"
        )
        assert not (workspace / "skills" / "x.txt").exists()

    def test_a_name_of_the_full_255_bytes_uploads(self, api_owner_a, session_a, workspace):
        name = "n" * 251 + ".txt"

        assert upload(api_owner_a, session_a, name, b"x").status_code == 201
        assert (workspace / name).read_bytes() == b"x"

        body = upload(api_owner_a, session_a, name, b"x").json()
        assert (body["name_changed"], body["requested_name"], body["name_change_reason"]) == (
            False,
            name,
            None,
        )

    def test_a_name_too_long_is_shortened_and_the_answer_says_so(self, api_owner_a, session_a, workspace):
        name = "report-" + "n" * 290 + ".csv"

        part = io.BytesIO(b"a,b\n")
        part.name = name  # sent as is (a SimpleUploadedFile would cut it to 255 before sending)

        response = api_owner_a.post(files_url(session_a), {"file": part}, format="multipart")

        assert response.status_code == 201, response.content
        body = response.json()
        kept = body["path"]
        assert body["name_changed"] is True and body["requested_name"] == name
        assert kept.endswith(".csv") and len(kept) == 255 and (workspace / kept).read_bytes() == b"a,b\n"
        assert "shortened to 255 characters" in body["name_change_reason"]

    def test_a_name_within_255_characters_but_over_255_bytes_is_shortened_too(
        self, api_owner_a, session_a, workspace
    ):
        name = "é" * 200 + ".txt"  # 404 bytes of UTF-8

        body = upload(api_owner_a, session_a, name, b"x").json()

        assert body["name_changed"] is True and body["requested_name"] == name
        assert body["path"] == "é" * 125 + ".txt" and len(body["path"].encode()) == 254
        assert "(254 bytes)" in body["name_change_reason"]
        assert (workspace / body["path"]).read_bytes() == b"x"

    def test_a_path_the_request_names_is_not_a_name_change(self, api_owner_a, session_a, workspace):
        body = upload(api_owner_a, session_a, "draft.txt", b"x", path="notes/final.txt").json()

        assert (body["path"], body["name_changed"], body["name_change_reason"]) == (
            "notes/final.txt",
            False,
            None,
        )

    @pytest.mark.parametrize("path", ["x" * 300, "x/" * 3000 + "y"])
    def test_names_over_the_file_system_limits_are_400(self, api_owner_a, session_a, path):
        for response in (
            api_owner_a.get(files_url(session_a, path)),
            api_owner_a.get(f"{SESSIONS}{session_a.pk}/previews/{path}"),
        ):
            assert_error_shape(response, 400, "invalid_path")
        assert api_owner_a.delete(files_url(session_a, path)).status_code in (400, 404)

    def test_an_upload_name_over_the_limit_is_400(self, api_owner_a, session_a):
        response = upload(api_owner_a, session_a, "n.txt", b"x", path="y" * 300)

        assert_error_shape(response, 400, "invalid_path")
