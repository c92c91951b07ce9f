"""S1 through the API on the services stack: daphne + a Celery worker + PostgreSQL + Redis, the
scripted demo model (no LLM configured), and an integrator's httpx client with an API key.

Upload tickets.csv -> ask for the report -> report.html and kpis.csv are listed and
downloadable, and the delivery record's checks agree with a recomputation from tickets.csv.
Without tickets.csv the failed read is an unresolved failure and nothing claims a report.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import httpx2 as httpx
import pytest

from sessions_app.runtime.llm.demo import compute_kpis

from .processes import web_and_worker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TICKETS = Path(__file__).resolve().parents[2] / "sessions_app" / "demo_data" / "tickets.csv"
REQUEST = "Please make the weekly support KPI report as HTML from tickets.csv"


@pytest.fixture
def api(tmp_path, api_owner_a):
    with web_and_worker(tmp_path) as address:
        with httpx.Client(
            base_url=f"http://{address}/api/v1",
            headers={"Authorization": f"Bearer {api_owner_a.api_key}"},
            timeout=40,
        ) as client:
            yield client


def run_turn(api, session_id: str, text: str, **extra) -> list[dict]:
    """Queue a message and long-poll the event log until its turn ends; returns the events."""
    response = api.post(f"/sessions/{session_id}/inputs/", json={"text": text, **extra})
    assert response.status_code == 202, response.text
    events, after = [], 0
    for _ in range(60):
        page = api.get(f"/sessions/{session_id}/events/", params={"after": after, "wait": 20}).json()
        events.extend(page["events"])
        after = page["last_seq"]
        if any(e["type"] == "turn.ended" for e in events):
            return events
    raise AssertionError(f"the turn did not end: {[e['type'] for e in events][-20:]}")


def test_s1_the_delivered_files_match_a_recomputation(api):
    session_id = api.post("/sessions/", json={"title": "S1"}).json()["id"]
    uploaded = api.post(
        f"/sessions/{session_id}/files/", files={"file": ("tickets.csv", TICKETS.read_bytes(), "text/csv")}
    )
    assert uploaded.status_code == 201, uploaded.text
    answer = uploaded.json()
    assert (answer["path"], answer["size"], answer["op"]) == (
        "tickets.csv",
        TICKETS.stat().st_size,
        "created",
    )
    assert answer["name_changed"] is False

    events = run_turn(api, session_id, REQUEST, attachments=["tickets.csv"])

    assert [e["data"]["reason"] for e in events if e["type"] == "turn.ended"] == ["completed"]
    changed = {e["data"]["path"] for e in events if e["type"] == "file.changed"}
    assert {"report.html", "kpis.csv"} <= changed
    tree = {entry["path"]: entry for entry in api.get(f"/sessions/{session_id}/files/").json()}
    assert {"tickets.csv", "report.html", "kpis.csv"} <= set(tree)

    kpis_file = api.get(f"/sessions/{session_id}/files/kpis.csv", params={"download": 1})
    assert kpis_file.status_code == 200
    assert kpis_file.headers["content-disposition"] == 'attachment; filename="kpis.csv"'
    assert kpis_file.headers["content-type"].startswith("text/csv")
    report = api.get(f"/sessions/{session_id}/files/report.html")
    assert report.headers["content-type"] == "text/html; charset=utf-8"
    assert report.headers["content-security-policy"].startswith("sandbox")
    assert len(report.content) == tree["report.html"]["size"]

    rows = list(csv.DictReader(io.StringIO(TICKETS.read_text())))
    expected = compute_kpis(rows)
    delivered = dict(csv.reader(io.StringIO(kpis_file.text)))
    assert delivered["tickets_total"] == str(len(rows)) == str(expected["tickets_total"])
    for metric in ("tickets_resolved", "resolution_rate_pct", "avg_first_response_minutes", "avg_csat"):
        assert delivered[metric] == str(expected[metric]), metric

    recorded = [e for e in events if e["type"] == "delivery.recorded"]
    assert len(recorded) == 1 and recorded[0]["data"]["checks_ok"] and recorded[0]["data"]["unresolved"] == 0
    delivery = api.get(f"/sessions/{session_id}/deliveries/").json()["results"][0]
    assert delivery["id"] == recorded[0]["data"]["delivery_id"]
    checks = {c["path"]: c for c in delivery["checks"]}
    csv_check = checks["kpis.csv"]
    assert csv_check["ok"] and csv_check["facts"]["rows"] == len(delivered) - 1  # minus the header row
    assert dict(csv_check["facts"]["sample_rows"]) == {k: v for k, v in delivered.items() if k != "metric"}
    html_check = checks["report.html"]
    kpi_table = next(t for t in html_check["facts"]["tables"] if t["id"] == "kpis")
    assert ["Tickets", str(len(rows))] in kpi_table["cells"]
    assert ["Avg CSAT (1-5)", str(expected["avg_csat"])] in kpi_table["cells"]
    files = {f["path"]: f for f in delivery["files"]}
    assert files["kpis.csv"]["size"] == len(kpis_file.content)


def test_s1_without_tickets_the_failed_read_is_unresolved(api):
    session_id = api.post("/sessions/", json={"title": "S1 without data"}).json()["id"]

    events = run_turn(api, session_id, REQUEST)

    delivery = api.get(f"/sessions/{session_id}/deliveries/").json()["results"][0]
    assert [f["tool"] for f in delivery["unresolved_failures"]] == ["fs_read"]
    assert "tickets.csv" in delivery["unresolved_failures"][0]["summary"]
    answer = delivery["final_answer"].lower()
    assert "tickets.csv" in answer
    assert "ready" not in answer and "validated" not in answer
    paths = {entry["path"] for entry in api.get(f"/sessions/{session_id}/files/").json()}
    assert "report.html" not in paths
    recorded = next(e for e in events if e["type"] == "delivery.recorded")
    assert recorded["data"]["unresolved"] == 1


def test_daphne_leaves_a_malformed_upload_body_to_our_error_shape(api):
    session_id = api.post("/sessions/", json={"title": "bad upload"}).json()["id"]

    response = api.post(
        f"/sessions/{session_id}/files/",
        content=b"--xyz--\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=xyz"},
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_error"
    assert "file" in response.json()["error"]["details"]
