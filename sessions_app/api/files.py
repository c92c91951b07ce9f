"""The Session workspace over HTTP: tree, raw bytes, previews, a person's uploads and deletes,
and the delivery records of completed turns.

Every path goes through the one validator the file tools use (`tools_app.workspace`), so
`..`, absolute paths, NUL and symlinks out answer 400 `path_escape` here exactly as they fail
for the model. Raw bytes are served with `Content-Security-Policy: sandbox`: an HTML file the
agent (or anyone) wrote runs in an opaque origin, with no access to the app's cookies or API,
whether it is opened in the preview iframe or in its own tab.

A program an admin gave a secret may have written it into a file (ARCHITECTURE §7): when the
tenant has secrets, text files are served, previewed and listed with every secret form masked
(streamed, so a large file costs no memory); images, PDFs and other binary files are served as
they are. Delivery records are stored redacted and redacted again when read (a secret set later).
"""

from __future__ import annotations

import os

from django.conf import settings
from django.http import FileResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from config.schema import error
from tools_app.base import ToolError
from tools_app.secrets import redact_byte_chunks, tenant_redactor
from tools_app.workspace import (
    CONTROL_CHARACTERS,
    WorkspaceLimitExceeded,
    delete_path,
    list_tree,
    relative_posix,
    resolve_in_workspace,
    save_upload,
    upload_destination,
)

from .. import artifacts
from ..models import Delivery
from ..runtime import engine
from ..upload_names import requested_upload_name
from .serializers import DeliverySerializer, WorkspaceEntrySerializer

MAX_TREE_ENTRIES = 5000
# Multipart framing around the file (boundaries, part headers, the `path` field).
MULTIPART_OVERHEAD_BYTES = 64 * 1024
REDACTED_READ_BYTES = 64 * 1024

# Served in an opaque origin: no cookies, no storage, no requests anywhere (`default-src
# 'none'`), no forms. By default no script runs either: a sandboxed page with scripts can still
# navigate itself elsewhere and carry its own text along (CSP does not govern navigation), so
# scripts run only when the person asks for them (`?scripts=1`, the preview's "Run scripts").
_RAW_FILE_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:; "
    "media-src data: blob:; form-action 'none'; base-uri 'none'"
)
RAW_FILE_CSP = f"sandbox; {_RAW_FILE_POLICY}"
RAW_FILE_CSP_WITH_SCRIPTS = f"sandbox allow-scripts; script-src 'unsafe-inline'; {_RAW_FILE_POLICY}"


class WorkspacePathError(exceptions.APIException):
    """A path the workspace rule refuses, in the CONTRACT shape (`path_escape`, `not_found`, ...)."""

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, exc: ToolError, status_code: int | None = None):
        super().__init__(detail=str(exc), code=exc.code)
        if status_code is not None:
            self.status_code = status_code


class WorkspaceLimit(exceptions.APIException):
    def __init__(self, exc: WorkspaceLimitExceeded):
        super().__init__(detail=str(exc), code=exc.code)
        self.status_code = exc.status
        self.details = exc.details


def path_error(exc: ToolError) -> exceptions.APIException:
    if exc.code == "not_found":
        return exceptions.NotFound(str(exc))
    if exc.code == "workspace_missing":
        return exceptions.NotFound("This Session has no workspace yet.")
    return WorkspacePathError(exc)


FILE_PATH_PARAMETER = OpenApiParameter(
    "path", str, OpenApiParameter.PATH, description="file path relative to the workspace root"
)
UPLOAD_REQUEST = {
    "multipart/form-data": {
        "type": "object",
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "path": {
                "type": "string",
                "description": "destination in the workspace (default: the file's name); "
                "ending in `/`, a directory to put it in",
            },
        },
        "required": ["file"],
    }
}
UPLOADED = inline_serializer(
    "UploadedFile",
    {
        "path": serializers.CharField(),
        "size": serializers.IntegerField(),
        "op": serializers.ChoiceField(choices=["created", "modified"]),
        "name_changed": serializers.BooleanField(
            help_text="The file was kept under another name than the one sent (see `requested_name`)."
        ),
        "requested_name": serializers.CharField(
            help_text="The file name as the request sent it, before any change for safety."
        ),
        "name_change_reason": serializers.CharField(
            allow_null=True, help_text="Why the name changed; null when it did not."
        ),
    },
)


def _name_change(requested: str, kept: str, user_path: str | None) -> str | None:
    """Why the file kept under `kept` (a workspace path) is not named `requested`, or None."""
    if user_path and not user_path.strip().endswith("/"):
        return None  # the request named the path itself
    kept_name = kept.rsplit("/", 1)[-1]
    if kept_name == requested:
        return None
    if len(requested.encode()) > len(kept_name.encode()):
        return (
            f"the name was shortened to {len(kept_name)} characters ({len(kept_name.encode())} bytes), "
            "the longest a file name may be"
        )
    return "the name was changed to one the workspace can keep"


class SessionFilesMixin:
    # Actions of `SessionViewSet`: the Session comes from its tenant-scoped `get_object`.
    # (A comment, not a docstring: drf-spectacular would show it on every Session operation.)

    def _workspace(self):
        session = self.get_object()
        return session, engine.workspace_path(session)

    def _resolve(self, workspace, user_path: str, *, must_exist: bool = True):
        try:
            return resolve_in_workspace(workspace, user_path, must_exist=must_exist)
        except ToolError as exc:
            raise path_error(exc) from None

    def _raw_url(self, session, rel: str) -> str:
        from urllib.parse import quote

        return f"/api/v1/sessions/{session.pk}/files/{quote(rel)}"

    @extend_schema(operation_id="sessions_files_list", responses=WorkspaceEntrySerializer(many=True))
    def files_list(self, request, pk=None):
        """The workspace tree: every file and directory, sorted by path (at most 5000 entries)."""
        session, workspace = self._workspace()
        if not workspace.is_dir():
            return Response([])
        entries = list_tree(workspace, max_entries=MAX_TREE_ENTRIES + 1)
        redactor = tenant_redactor(session.tenant_id)
        if redactor:  # a name is a program's to choose too
            entries = [{**entry, "path": redactor.redact(entry["path"])} for entry in entries]
        response = Response(entries[:MAX_TREE_ENTRIES])
        if len(entries) > MAX_TREE_ENTRIES:
            response["X-Files-Truncated"] = "true"
        return response

    @extend_schema(
        operation_id="sessions_files_upload",
        request=UPLOAD_REQUEST,
        responses={
            201: UPLOADED,
            400: error(
                "`validation_error` (no `file`), `malformed_body`, `too_many_fields`, `path_escape`, "
                "`invalid_path`, `is_a_directory`, `too_many_files` (XAGENT_WORKSPACE_MAX_FILES)."
            ),
            413: error(
                "`file_too_large` (XAGENT_UPLOAD_MAX_BYTES), `workspace_full` (XAGENT_WORKSPACE_MAX_BYTES)."
            ),
        },
    )
    def files_upload(self, request, pk=None):
        """Upload one file (multipart `file`, optional `path`) into the workspace. It is
        announced as `file.changed` with who uploaded it, and can be named in the next input's
        `attachments`."""
        session, workspace = self._workspace()
        limit = settings.XAGENT_UPLOAD_MAX_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit + MULTIPART_OVERHEAD_BYTES:
            # Refused before the body is parsed; the code is the one a just-too-large file gets.
            raise WorkspaceLimit(
                WorkspaceLimitExceeded(
                    f"the upload is {declared:,} bytes, over the {limit:,}-byte upload limit",
                    code="file_too_large",
                    status=413,
                    details={"content_length": declared, "limit_bytes": limit},
                )
            )
        upload = request.data.get("file")
        if upload is None or not hasattr(upload, "chunks"):
            raise serializers.ValidationError(
                {
                    "file": [
                        "No file arrived: send it as the multipart part `file` with a filename "
                        "(a part without a filename, or a body that does not parse as multipart, holds none)."
                    ]
                }
            )
        user_path = request.data.get("path")
        if user_path is not None and (not isinstance(user_path, str) or len(user_path) > 1000):
            raise serializers.ValidationError({"path": ["A relative path of at most 1000 characters."]})
        workspace.mkdir(parents=True, exist_ok=True)
        try:
            target = upload_destination(workspace, upload.name or "", user_path)
            op = save_upload(
                workspace,
                target,
                upload.chunks(),
                size=upload.size,
                max_bytes=limit,
                max_files=settings.XAGENT_WORKSPACE_MAX_FILES,
                max_workspace_bytes=settings.XAGENT_WORKSPACE_MAX_BYTES,
            )
        except WorkspaceLimitExceeded as exc:
            raise WorkspaceLimit(exc) from None
        except ToolError as exc:
            raise path_error(exc) from None
        except OSError as exc:  # a name too long for the file system, a file where a directory must go
            raise WorkspacePathError(
                ToolError(f"the file could not be written there: {exc.strerror or exc}", code="invalid_path")
            ) from None
        rel = relative_posix(workspace, target)
        engine.record_person_file_change(session.pk, rel, op, request.user)
        requested = requested_upload_name(request, "file", upload.name)
        reason = _name_change(requested, rel, user_path)
        return Response(
            {
                "path": rel,
                "size": upload.size,
                "op": op,
                "name_changed": reason is not None,
                "requested_name": requested,
                "name_change_reason": reason,
            },
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        operation_id="sessions_files_retrieve",
        parameters=[
            FILE_PATH_PARAMETER,
            OpenApiParameter("download", bool, description="`1`: `Content-Disposition: attachment`"),
            OpenApiParameter(
                "scripts",
                bool,
                description="`1`: let the page's scripts run (still sandboxed: no cookies, storage or requests)",
            ),
        ],
        responses={
            # Whatever the file is: text/csv, text/html, image/png, application/octet-stream…
            (200, "*/*"): OpenApiResponse(
                OpenApiTypes.BINARY, description="the file's bytes, with its content type"
            ),
            400: error("`path_escape`, `invalid_path` or `is_a_directory`."),
        },
    )
    def file_content(self, request, pk=None, path=""):
        """The file's bytes with its content type. Served inline (or as an attachment with
        `?download=1`) under `Content-Security-Policy: sandbox`; scripts run only with `?scripts=1`.
        When the tenant has secrets, a text file's secrets are masked (`[REDACTED]`)."""
        session, workspace = self._workspace()
        resolved = self._resolve(workspace, path)
        if resolved.is_dir():
            raise WorkspacePathError(ToolError(f"{path!r} is a directory", code="is_a_directory"))
        try:
            handle = open(os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW), "rb")  # noqa: SIM115 (FileResponse closes it)
        except OSError as exc:
            raise exceptions.NotFound(f"{path!r} could not be opened: {exc.strerror or exc}") from None
        as_attachment = request.query_params.get("download") in ("1", "true", "yes")
        content_type = artifacts.content_type_of(resolved.name)
        redactor = tenant_redactor(session.tenant_id)
        if redactor and artifacts.is_text_file(resolved, resolved.name):
            response = StreamingHttpResponse(_redacted(handle, redactor), content_type=content_type)
        else:
            response = FileResponse(handle, content_type=content_type)
        # A name the model or a shell chose may hold control characters; headers may not.
        response["Content-Disposition"] = content_disposition_header(
            as_attachment, CONTROL_CHARACTERS.sub("_", resolved.name)
        )
        with_scripts = request.query_params.get("scripts") in ("1", "true", "yes")
        response["Content-Security-Policy"] = RAW_FILE_CSP_WITH_SCRIPTS if with_scripts else RAW_FILE_CSP
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "private, no-cache"
        response["Cross-Origin-Resource-Policy"] = "same-origin"
        # The Session page frames HTML previews; nothing else may.
        response["X-Frame-Options"] = "SAMEORIGIN"
        return response

    @extend_schema(
        operation_id="sessions_files_destroy",
        parameters=[FILE_PATH_PARAMETER],
        responses={204: None, 400: error("`path_escape` or `invalid_path` (the workspace itself).")},
    )
    def file_delete(self, request, pk=None, path=""):
        """Delete a file or a directory tree: a person's own action, so no approval; it is
        announced as `file.changed` `deleted` with who did it, and logged."""
        session, workspace = self._workspace()
        try:
            rel, _ = delete_path(workspace, path)
        except ToolError as exc:
            raise path_error(exc) from None
        engine.record_person_file_change(session.pk, rel, "deleted", request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="sessions_previews_retrieve",
        parameters=[FILE_PATH_PARAMETER],
        responses={
            200: inline_serializer(
                "FilePreview",
                {
                    "path": serializers.CharField(),
                    "kind": serializers.ChoiceField(
                        choices=["html", "image", "pdf", "csv", "markdown", "text", "binary"]
                    ),
                    "size": serializers.IntegerField(),
                    "content_type": serializers.CharField(),
                    "url": serializers.CharField(required=False),
                    "scripts_url": serializers.CharField(
                        required=False, help_text="html: the same page with its scripts allowed"
                    ),
                    "row_count_exact": serializers.BooleanField(required=False),
                    "line_count_exact": serializers.BooleanField(required=False),
                    "header": serializers.ListField(child=serializers.CharField(), required=False),
                    "rows": serializers.ListField(
                        child=serializers.ListField(child=serializers.CharField()), required=False
                    ),
                    "row_count": serializers.IntegerField(required=False),
                    "column_count": serializers.IntegerField(required=False),
                    "html": serializers.CharField(required=False, help_text="sanitized (nh3)"),
                    "text": serializers.CharField(required=False),
                    "line_count": serializers.IntegerField(required=False),
                    "truncated": serializers.BooleanField(required=False),
                    "message": serializers.CharField(required=False),
                },
            ),
            400: error("`path_escape`, `invalid_path` or `is_a_directory`."),
        },
    )
    def file_preview(self, request, pk=None, path=""):
        """What the Session page shows of a file: a CSV table (first 100 rows, with counts),
        Markdown rendered and sanitized, text, or the raw URL for HTML, images and PDF."""
        session, workspace = self._workspace()
        resolved = self._resolve(workspace, path)
        if resolved.is_dir():
            raise WorkspacePathError(ToolError(f"{path!r} is a directory", code="is_a_directory"))
        rel = relative_posix(workspace, resolved)
        redactor = tenant_redactor(session.tenant_id)
        try:
            shown = artifacts.preview(resolved, rel, self._raw_url(session, rel), redactor)
            return Response(redactor.redact_data(shown) if redactor else shown)
        except OSError as exc:
            raise exceptions.NotFound(f"{path!r} could not be read: {exc.strerror or exc}") from None

    @extend_schema(operation_id="sessions_deliveries_list", responses=DeliverySerializer(many=True))
    def deliveries_list(self, request, pk=None):
        """Delivery records of the Session's completed turns, oldest first."""
        session = self.get_object()
        rows = Delivery.objects.filter(session=session).select_related("turn")
        page = self.paginate_queryset(rows)
        redactor = tenant_redactor(session.tenant_id)
        return self.get_paginated_response(redactor.redact_data(DeliverySerializer(page, many=True).data))

    @extend_schema(
        operation_id="sessions_deliveries_retrieve",
        parameters=[OpenApiParameter("delivery_id", int, OpenApiParameter.PATH)],
        responses=DeliverySerializer,
    )
    def delivery_detail(self, request, pk=None, delivery_id=None):
        session = self.get_object()
        delivery = Delivery.objects.filter(session=session, pk=delivery_id).select_related("turn").first()
        if delivery is None:
            raise exceptions.NotFound("No delivery matches the given query.")
        return Response(tenant_redactor(session.tenant_id).redact_data(DeliverySerializer(delivery).data))


def _redacted(handle, redactor):
    """The file's bytes, secrets masked; closes the file when done or when the client goes."""
    try:
        yield from redact_byte_chunks(iter(lambda: handle.read(REDACTED_READ_BYTES), b""), redactor)
    finally:
        handle.close()


FILE_PARSERS = [MultiPartParser]
FILE_RENDERERS = [JSONRenderer]
