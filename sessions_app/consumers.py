"""`/ws/sessions/{id}/?after=<seq>`: the Session's event log, then live events.

The log is the truth; channel-layer messages only say "something new". Each frame is sent
in `seq` order with no gaps or duplicates: a notification that skips ahead makes the
consumer read the missing range from the log first. Client frames go through the same owner
operations as the REST API.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from tenancy_app.ws import CLOSE_NOT_FOUND, TenantScopedConsumer

from .choices import InputKind
from .models import Session, SessionEvent
from .runtime import brain
from .runtime.events import session_group

BACKLOG_PAGE = 500


class SessionConsumer(TenantScopedConsumer):
    async def tenant_connect(self):
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        self.session = await self._load_session(session_id)
        if self.session is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        try:
            self.last_seq = max(int(self._query("after") or 0), 0)
        except ValueError:
            self.last_seq = 0
        self.group = session_group(self.session.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self._send_from_log()

    async def disconnect(self, code):
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # --- server -> client ---------------------------------------------------------------------

    async def session_event(self, message):
        event = message["event"]
        if event["seq"] <= self.last_seq:
            return  # already sent (backlog or an earlier notification)
        if event["seq"] == self.last_seq + 1:
            await self.send_json(event)
            self.last_seq = event["seq"]
        else:
            await self._send_from_log()

    async def session_delta(self, message):
        await self.send_json(message["event"])

    async def _send_from_log(self):
        while True:
            events = await self._events_after(self.last_seq)
            for event in events:
                await self.send_json(event)
                self.last_seq = event["seq"]
            if len(events) < BACKLOG_PAGE:
                return

    # --- client -> server -----------------------------------------------------------------------

    async def receive_json(self, content, **kwargs):
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "input":
            text = content.get("text")
            input_kind = content.get("kind") or InputKind.MESSAGE
            if (
                not isinstance(text, str)
                or not text.strip()
                or input_kind not in (InputKind.MESSAGE, InputKind.GUIDANCE)
            ):
                await self._reply_error(
                    "invalid_input", "An input frame needs a non-empty `text` and kind message/guidance."
                )
                return
            created, _ = await database_sync_to_async(brain.submit_input)(
                self.session, kind=input_kind, text=text, user=self.scope["user"]
            )
            await self.send_json(
                {"seq": None, "type": "ack", "data": {"input_id": created.pk, "status": "queued"}}
            )
        elif kind == "interrupt":
            created, _ = await database_sync_to_async(brain.interrupt)(self.session, user=self.scope["user"])
            await self.send_json(
                {"seq": None, "type": "ack", "data": {"input_id": created.pk, "status": "queued"}}
            )
        elif kind == "decide":
            await self._reply_error("not_available", "Approvals are not available yet on this server.")
        else:
            await self._reply_error("unknown_frame", "Frames are {type: input|interrupt|decide}.")

    async def _reply_error(self, code: str, message: str):
        await self.send_json({"seq": None, "type": "error", "data": {"code": code, "message": message}})

    # --- helpers ----------------------------------------------------------------------------------

    def _query(self, name: str) -> str | None:
        from urllib.parse import parse_qs

        return parse_qs(self.scope.get("query_string", b"").decode("latin1")).get(name, [None])[0]

    @database_sync_to_async
    def _load_session(self, session_id):
        return Session.objects.for_tenant(self.tenant).filter(pk=session_id, archived_at__isnull=True).first()

    @database_sync_to_async
    def _events_after(self, seq: int) -> list[dict]:
        rows = SessionEvent.objects.filter(session_id=self.session.pk, seq__gt=seq).order_by("seq")[
            :BACKLOG_PAGE
        ]
        return [row.as_dict() for row in rows]
