"""A chunked request body declares no Content-Length. DRF reads such a body as empty (the
input would be refused as "text is required", or worse, a PATCH would apply nothing), and Django
applies its size limit only to a declared length. Through the real ASGI app (as daphne calls
it), a chunked body is read like any other and the same 413 limit applies."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.core.asgi import get_asgi_application

from sessions_app.models import Input
from sessions_app.runtime import engine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_a(tenant_a, owner_a):
    return engine.create_session(tenant=tenant_a, owner=owner_a, title="chunked")


async def post_chunked(
    path: str, key: str, chunks: list[bytes], content_type: bytes = b"application/json"
) -> tuple[int, dict]:
    """POST through the ASGI app with `transfer-encoding: chunked` and no content-length."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", content_type),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    messages = [{"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks]
    messages.append({"type": "http.request", "body": b"", "more_body": False})
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(get_asgi_application()(scope, receive, send), 10)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


async def test_a_chunked_input_is_read_and_queued(session_a, api_owner_a):
    payload = json.dumps({"text": "sent in chunks"}).encode()
    status, body = await post_chunked(
        f"/api/v1/sessions/{session_a.pk}/inputs/", api_owner_a.api_key, [payload[:7], payload[7:]]
    )

    assert status == 202, body
    created = await database_sync_to_async(Input.objects.get)(pk=body["input_id"])
    assert created.payload["text"] == "sent in chunks"


async def test_a_chunked_body_over_the_limit_is_413_and_queues_nothing(session_a, api_owner_a, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    payload = json.dumps({"text": "x" * 5000}).encode()
    status, body = await post_chunked(
        f"/api/v1/sessions/{session_a.pk}/inputs/", api_owner_a.api_key, [payload[:2500], payload[2500:]]
    )

    assert status == 413
    assert body["error"]["code"] == "payload_too_large"
    assert not await database_sync_to_async(Input.objects.filter(session_id=session_a.pk).exists)()


async def test_a_chunked_upload_is_read_like_a_declared_one(session_a, api_owner_a):
    body = (
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="t.csv"\r\n'
        b"Content-Type: text/csv\r\n\r\n" + b"a,b\n1,2\n" * 20_000 + b"\r\n--xyz--\r\n"
    )
    status, answer = await post_chunked(
        f"/api/v1/sessions/{session_a.pk}/files/",
        api_owner_a.api_key,
        [body[i : i + 65536] for i in range(0, len(body), 65536)],
        content_type=b"multipart/form-data; boundary=xyz",
    )

    assert status == 201, answer
    assert (answer["path"], answer["size"], answer["op"], answer["name_changed"]) == (
        "t.csv",
        160_000,
        "created",
        False,
    )


async def test_a_multipart_body_of_too_many_parts_is_400(session_a, api_owner_a, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    parts = b"".join(
        b'--xyz\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i for i in range(50)
    )
    status, answer = await post_chunked(
        f"/api/v1/sessions/{session_a.pk}/files/",
        api_owner_a.api_key,
        [parts + b"--xyz--\r\n"],
        content_type=b"multipart/form-data; boundary=xyz",
    )

    assert status == 400 and answer["error"]["code"] == "too_many_fields", answer
