"""`/ws/sessions/{id}/?after=<seq>`: the Session's event log, then live events.

The log is the truth; channel-layer messages only say "something new". Each frame is sent
in `seq` order with no gaps or duplicates: a notification that skips ahead makes the
consumer read the missing range from the log first. Client frames go through the same owner
operations as the REST API.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from tenancy_app.ws import CLOSE_NOT_FOUND, TenantScopedConsumer

from .api.serializers import DecisionFrameSerializer, InputAnswerFrameSerializer, InputCreateSerializer
from .models import Session, SessionEvent
from .runtime import brain
from .runtime.engine import workspace_path
from .runtime.events import session_group, tenant_sessions_group

BACKLOG_PAGE = 500
MAX_SEQ = 2**63 - 1


def _first_error(errors: dict) -> str:
    for field, messages in errors.items():
        first = messages[0] if isinstance(messages, list) and messages else messages
        return f"{field}: {first}"
    return ""


class SessionConsumer(TenantScopedConsumer):
    async def tenant_connect(self):
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        self.session = await self._load_session(session_id)
        if self.session is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        try:
            self.last_seq = min(max(int(self._query("after") or 0), 0), MAX_SEQ)
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

    async def session_events(self, message):
        """The events of one commit, sent by the runtime as one message."""
        for event in message["events"]:
            await self.session_event({"event": event})

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
            # The same serializer, limits and owner operation as POST /sessions/{id}/inputs/.
            body = InputCreateSerializer(data=content, context={"workspace": workspace_path(self.session)})
            if not body.is_valid():
                await self.send_error(
                    "validation_error", "The input frame is not valid; see details.", details=body.errors
                )
                return
            created, _ = await database_sync_to_async(brain.submit_input)(
                self.session,
                kind=body.validated_data["kind"],
                text=body.validated_data["text"],
                attachments=body.validated_data.get("attachments"),
                user=self.scope["user"],
                caller=self.principal.ident,
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
            code, message, approval_id = await self._decide(content)
            if code:
                # Name the approval so a client with several decisions in flight can match the answer.
                approval_id = content.get("approval_id")
                await self.send_error(
                    code, message, approval_id=approval_id if isinstance(approval_id, int) else None
                )
            else:
                await self.send_json(
                    {"seq": None, "type": "ack", "data": {"approval_id": approval_id, "status": message}}
                )
        elif kind == "answer_input":
            code, message, details = await self._answer_input(content)
            request_id = content.get("request_id")
            request_id = (
                request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else None
            )
            if code:
                await self.send_error(code, message, details=details or {}, request_id=request_id)
            else:
                await self.send_json(
                    {"seq": None, "type": "ack", "data": {"request_id": request_id, "status": message}}
                )
        else:
            await self.send_error("unknown_frame", "Frames are {type: input|interrupt|decide|answer_input}.")

    # --- helpers ----------------------------------------------------------------------------------

    def _query(self, name: str) -> str | None:
        from urllib.parse import parse_qs

        return parse_qs(self.scope.get("query_string", b"").decode("latin1")).get(name, [None])[0]

    @database_sync_to_async
    def _decide(self, content) -> tuple[str, str, int | None]:
        """The same owner operation as POST /approvals/{id}/decide/. Returns (error code, message, id)."""
        from approvals_app.actions import AlreadyDecided
        from approvals_app.models import PendingApproval

        from .runtime import approvals

        body = DecisionFrameSerializer(data=content)
        if not body.is_valid():
            return (
                "invalid_decision",
                "A decide frame needs an integer approval_id and decision approve/reject"
                f" (and a comment of at most 5000 characters): {_first_error(body.errors)}",
                None,
            )
        decision, approval_id = body.validated_data["decision"], body.validated_data["approval_id"]
        # The same visibility filter as the REST routes: an approval this person cannot see is
        # "not found" here too, never "permission denied" that would confirm it exists.
        approval = (
            approvals.visible_to(
                PendingApproval.objects.for_tenant(self.tenant), self.scope["user"], self.membership
            )
            .filter(pk=approval_id, session_id=self.session.pk)
            .first()
        )
        if approval is None:
            return "not_found", "No such approval in this session.", None
        # The role is read again (not the socket's membership from connect): a demoted member
        # must not decide from a socket opened before.
        if not approvals.may_decide(approval, self.scope["user"]):
            return "permission_denied", "You may not decide this approval.", None
        comment = body.validated_data.get("comment") or ""
        try:
            approval = brain.submit_decision(approval, decision, user=self.scope["user"], comment=comment)
        except AlreadyDecided as exc:
            return "already_decided", f"This approval was already {exc.approval.status}.", None
        return "", approval.status, approval.pk

    @database_sync_to_async
    def _answer_input(self, content) -> tuple[str, str, dict | None]:
        """The same owner operation as POST /sessions/{id}/input-requests/{rid}/answer/.
        Returns (error code, message or the new status, error details)."""
        from .models import InputRequest
        from .runtime import approvals, engine

        body = InputAnswerFrameSerializer(data=content)
        if not body.is_valid():
            return "validation_error", "The answer_input frame is not valid; see details.", body.errors
        request = (
            InputRequest.objects.for_tenant(self.tenant)
            .filter(pk=body.validated_data["request_id"], session_id=self.session.pk)
            .first()
        )
        if request is None:
            return "not_found", "No such input request in this session.", None
        # The role is read again (not the socket's membership from connect), as for `decide`.
        if not approvals.may_answer_input(request, self.scope["user"]):
            return "permission_denied", "You may not answer this request.", None
        try:
            request = engine.answer_input(
                request,
                body.validated_data["action"],
                body.validated_data.get("content"),
                user=self.scope["user"],
            )
        except engine.InvalidAnswer as exc:
            return (
                "validation_error",
                "The answer does not fit the requested schema; see details.",
                {"content": exc.errors},
            )
        except engine.AlreadyAnswered as exc:
            return "already_decided", f"This request was already {exc.request.status}.", None
        return "", request.status, None

    @database_sync_to_async
    def _load_session(self, session_id):
        return Session.objects.for_tenant(self.tenant).filter(pk=session_id, archived_at__isnull=True).first()

    @database_sync_to_async
    def _events_after(self, seq: int) -> list[dict]:
        rows = SessionEvent.objects.filter(session_id=self.session.pk, seq__gt=seq).order_by("seq")[
            :BACKLOG_PAGE
        ]
        return [row.as_dict() for row in rows]


class SessionListConsumer(TenantScopedConsumer):
    """`/ws/sessions/`: `session.status` changes of the tenant's Sessions, for the list page.

    Each frame is the Session's own log event plus `"session": "<id>"` (its `seq` is that
    Session's). Nothing is replayed: a client loads `GET /api/v1/sessions/` after connecting
    and applies the frames that follow. Only the tenant bound at the handshake is followed.
    """

    async def tenant_connect(self):
        self.group = tenant_sessions_group(self.tenant.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def sessions_status(self, message):
        await self.send_json(message["event"])

    async def receive_json(self, content, **kwargs):
        await self.send_error("unknown_frame", "This stream takes no client frames.")
