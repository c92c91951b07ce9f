"""Delivery records: what a completed turn delivered, checked by real parsers (CONTRACT
`GET /sessions/{id}/deliveries/`, event `delivery.recorded`).

The S1 runs drive the real runtime in-process with the scripted demo model; the KPI figures in
the record are compared with a recomputation from tickets.csv using `csv`.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image
from pypdf import PdfWriter

from sessions_app import artifacts
from sessions_app.models import Delivery, Message, SessionEvent, Turn
from sessions_app.runtime import brain, deliveries, engine
from sessions_app.runtime.llm.demo import compute_kpis

from ..runtime.helpers import drive_until_idle, send
from ..tenancy.isolation import assert_error_shape

TICKETS = Path(__file__).resolve().parents[2] / "sessions_app" / "demo_data" / "tickets.csv"
REPORT_REQUEST = "Make the weekly support KPI report from tickets.csv"


@pytest.fixture
def session_a(tenant_a, owner_a):
    return engine.create_session(tenant=tenant_a, owner=owner_a, title="S1")


def deliveries_url(session) -> str:
    return f"/api/v1/sessions/{session.pk}/deliveries/"


def check_of(delivery: dict, path: str) -> dict:
    return next(c for c in delivery["checks"] if c["path"] == path)


class TestS1:
    def test_the_record_holds_what_a_csv_parser_finds_in_the_delivered_files(self, api_owner_a, session_a):
        uploaded = api_owner_a.post(
            f"/api/v1/sessions/{session_a.pk}/files/",
            {"file": SimpleUploadedFile("tickets.csv", TICKETS.read_bytes())},
            format="multipart",
        )
        assert uploaded.status_code == 201
        send(session_a, REPORT_REQUEST)

        drive_until_idle(session_a)

        body = api_owner_a.get(deliveries_url(session_a)).json()
        assert len(body["results"]) == 1
        delivery = body["results"][0]
        assert (
            delivery["turn_number"] == 1 and delivery["checks_ok"] and delivery["unresolved_failures"] == []
        )
        assert {f["path"] for f in delivery["files"]} == {"report.html", "kpis.csv"}
        assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in delivery["files"])

        expected = compute_kpis(list(csv.DictReader(io.StringIO(TICKETS.read_text()))))
        kpis = check_of(delivery, "kpis.csv")
        assert kpis["check"] == "csv" and kpis["ok"]
        assert kpis["facts"]["header"] == ["metric", "value"]
        reported = dict(kpis["facts"]["sample_rows"])
        assert (
            reported["tickets_total"]
            == str(expected["tickets_total"])
            == str(sum(1 for _ in csv.DictReader(io.StringIO(TICKETS.read_text()))))
        )
        assert reported["resolution_rate_pct"] == str(expected["resolution_rate_pct"])
        assert reported["avg_csat"] == str(expected["avg_csat"])
        assert kpis["facts"]["rows"] == len(reported)

        report = check_of(delivery, "report.html")
        assert report["check"] == "html" and report["ok"]
        kpi_table = next(t for t in report["facts"]["tables"] if t["id"] == "kpis")
        assert kpi_table["headers"] == ["KPI", "Value"]
        assert ["Tickets", str(expected["tickets_total"])] in kpi_table["cells"]

        event = SessionEvent.objects.get(session=session_a, type="delivery.recorded")
        assert event.data == {
            "delivery_id": delivery["id"],
            "turn_id": delivery["turn"],
            "checks_ok": True,
            "unresolved": 0,
            "outcome": "delivered",
        }
        turn_ended = SessionEvent.objects.get(session=session_a, type="turn.ended")
        assert event.seq < turn_ended.seq

    def test_without_tickets_the_failed_read_is_unresolved(self, api_owner_a, session_a):
        send(session_a, REPORT_REQUEST)

        drive_until_idle(session_a)

        delivery = api_owner_a.get(deliveries_url(session_a)).json()["results"][0]
        failures = delivery["unresolved_failures"]
        assert [f["tool"] for f in failures] == ["fs_read"]
        assert "tickets.csv" in failures[0]["summary"]
        assert delivery["files"] == [] and delivery["checks"] == []
        event = SessionEvent.objects.get(session=session_a, type="delivery.recorded")
        assert event.data["unresolved"] == 1

    def test_a_persons_upload_during_the_turn_is_not_the_turns_output(self, api_owner_a, session_a, owner_a):
        api_owner_a.post(
            f"/api/v1/sessions/{session_a.pk}/files/",
            {"file": SimpleUploadedFile("tickets.csv", TICKETS.read_bytes())},
            format="multipart",
        )
        send(session_a, REPORT_REQUEST)
        brain.drive(session_a.pk, max_steps=2)  # the turn is under way
        uploaded = api_owner_a.post(
            f"/api/v1/sessions/{session_a.pk}/files/",
            {"file": SimpleUploadedFile("notes.md", b"# mine")},
            format="multipart",
        )
        assert uploaded.status_code == 201

        drive_until_idle(session_a)

        delivery = api_owner_a.get(deliveries_url(session_a)).json()["results"][0]
        assert {f["path"] for f in delivery["files"]} == {"report.html", "kpis.csv"}

    def test_one_record_per_completed_turn_and_the_detail_route(self, api_owner_a, session_a):
        send(session_a, "hello")
        drive_until_idle(session_a)
        send(session_a, "hello again")
        drive_until_idle(session_a)

        rows = api_owner_a.get(deliveries_url(session_a)).json()["results"]
        assert [r["turn_number"] for r in rows] == [1, 2]
        detail = api_owner_a.get(f"{deliveries_url(session_a)}{rows[1]['id']}/")
        assert detail.status_code == 200 and detail.json() == rows[1]
        assert_error_shape(api_owner_a.get(f"{deliveries_url(session_a)}999999/"), 404, "not_found")


def call(call_id, name, arguments):
    return {"id": call_id, "name": name, "arguments": json.dumps(arguments)}


class TestUnresolvedFailures:
    def turn(self, session, steps):
        turn = Turn.objects.create(tenant=session.tenant, session=session, number=1)
        for calls, results in steps:
            Message.objects.create(
                tenant=session.tenant, session=session, turn=turn, role="assistant", tool_calls=calls
            )
            for call_id, ok, content in results:
                Message.objects.create(
                    tenant=session.tenant, session=session, turn=turn, role="tool", tool_call_id=call_id,
                    content=content, is_error=not ok,
                )  # fmt: skip
        return turn

    def test_a_later_success_on_the_same_target_resolves_a_failure(self, session_a):
        turn = self.turn(
            session_a,
            [
                (
                    [call("c1", "fs_write", {"path": "a.txt", "content": "x"})],
                    [("c1", False, "denied\nmore")],
                ),
                ([call("c2", "fs_write", {"path": "b.txt", "content": "x"})], [("c2", False, "disk full")]),
                (
                    [call("c3", "fs_write", {"path": "a.txt", "content": "y"})],
                    [("c3", True, "created a.txt")],
                ),
            ],
        )

        assert deliveries.unresolved_failures(turn.pk) == [
            {"call_id": "c2", "tool": "fs_write", "summary": "disk full"}
        ]

    def test_a_success_of_another_tool_resolves_nothing(self, session_a):
        turn = self.turn(
            session_a,
            [
                ([call("c1", "fs_read", {"path": "t.csv"})], [("c1", False, "'t.csv' does not exist")]),
                ([call("c2", "fs_list", {"path": "t.csv"})], [("c2", True, "listed")]),
            ],
        )

        assert [f["call_id"] for f in deliveries.unresolved_failures(turn.pk)] == ["c1"]

    def test_the_turn_is_read_in_one_query_without_the_texts_of_its_successful_results(self, session_a):
        turn = self.turn(
            session_a,
            [
                ([call("c1", "fs_read", {"path": "big.txt"})], [("c1", True, "x" * 200_000)]),
                ([call("c2", "fs_read", {"path": "gone.txt"})], [("c2", False, "'gone.txt' does not exist")]),
            ],
        )
        Message.objects.create(
            tenant=session_a.tenant,
            session=session_a,
            turn=turn,
            role="assistant",
            content="Read one of two.",
        )
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        decisions: list = []
        with CaptureQueriesContext(connection) as queries:
            failures, answer = deliveries._read_messages(turn.pk, decisions)

        assert (failures, answer) == (
            [{"call_id": "c2", "tool": "fs_read", "summary": "'gone.txt' does not exist"}],
            "Read one of two.",
        )
        # The messages, then (a failure being there) the turn's decided approvals: no per-row reads.
        assert len(queries.captured_queries) == 2, [q["sql"] for q in queries.captured_queries]
        assert '"sessions_app_message"."content"' not in queries.captured_queries[0]["sql"].split(" CASE ")[0]


class TestChecks:
    def check(self, tmp_path, name, content) -> artifacts.Check:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return artifacts.check_file(path, name)

    def test_csv(self, tmp_path):
        good = self.check(tmp_path, "a.csv", "x,y\n1,2\n3,4\n")
        assert (
            good.ok
            and good.facts["rows"] == 2
            and good.facts["columns"] == 2
            and good.facts["header"] == ["x", "y"]
        )
        ragged = self.check(tmp_path, "b.csv", "x,y\n1,2,3\n")
        assert not ragged.ok and ragged.facts["ragged_lines"] == [2]
        assert not self.check(tmp_path, "c.csv", "").ok
        assert not self.check(tmp_path, "d.csv", b"x,y\n\xff\xfe,1\n").ok

    def test_html_lists_tables_and_headings(self, tmp_path):
        result = self.check(
            tmp_path,
            "r.html",
            "<title>R</title><h1>Top</h1><h2>Sub</h2><table id=t><tr><th>A</th><th>B</th></tr><tr><td>1</td><td>2</td></tr></table>",
        )
        assert result.ok and result.facts["title"] == "R"
        assert [h["text"] for h in result.facts["headings"]] == ["Top", "Sub"]
        assert result.facts["tables"][0]["id"] == "t" and result.facts["tables"][0]["rows"] == 1
        assert not self.check(tmp_path, "empty.html", "<html><body></body></html>").ok

    def test_json_text_and_markdown(self, tmp_path):
        assert self.check(tmp_path, "a.json", '{"a": 1}').facts["keys"] == ["a"]
        bad = self.check(tmp_path, "b.json", '{"a": ')
        assert not bad.ok and "does not parse" in bad.detail
        assert self.check(tmp_path, "n.md", "# T\n\ntext\n").facts["headings"] == ["T"]
        assert not self.check(tmp_path, "latin.txt", "caf\xe9".encode("latin-1")).ok

    def test_images_and_pdfs_open_with_their_libraries(self, tmp_path):
        buffer = io.BytesIO()
        Image.new("RGB", (3, 2), "red").save(buffer, "PNG")
        image = self.check(tmp_path, "i.png", buffer.getvalue())
        assert image.ok and image.facts == {"format": "PNG", "width": 3, "height": 2}
        assert not self.check(tmp_path, "broken.png", buffer.getvalue()[:20]).ok

        writer = PdfWriter()
        writer.add_blank_page(100, 100)
        writer.add_blank_page(100, 100)
        pdf = io.BytesIO()
        writer.write(pdf)
        assert self.check(tmp_path, "d.pdf", pdf.getvalue()).facts == {"pages": 2}
        assert not self.check(tmp_path, "bad.pdf", b"%PDF-1.4 nothing").ok

    def test_other_files_are_only_listed(self, tmp_path):
        result = self.check(tmp_path, "a.bin", b"\x00\x01")
        assert result.ok and result.check == "exists"


def test_a_delivery_is_a_row_of_its_session_tenant(api_owner_a, session_a):
    send(session_a, "hello")
    drive_until_idle(session_a)

    assert Delivery.objects.get(session=session_a).tenant_id == session_a.tenant_id


def test_the_admin_shows_a_tenant_admin_only_their_deliveries(owner_a, session_a, tenant_b, outsider_b):
    from django.test import Client

    send(session_a, "hello")
    drive_until_idle(session_a)
    session_b = engine.create_session(tenant=tenant_b, owner=outsider_b, title="B")
    send(session_b, "hello")
    drive_until_idle(session_b)
    client = Client()
    client.force_login(owner_a)

    response = client.get("/admin/sessions_app/delivery/")

    assert response.status_code == 200
    assert [d.session_id for d in response.context["cl"].result_list] == [session_a.pk]
    other = Delivery.objects.get(session=session_b)
    assert client.get(f"/admin/sessions_app/delivery/{other.pk}/change/").status_code in (302, 404)
    mine = Delivery.objects.get(session=session_a)
    page = client.get(f"/admin/sessions_app/delivery/{mine.pk}/change/")
    assert page.status_code == 200 and b"checks" in page.content
