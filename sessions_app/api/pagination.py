from config.api import CursorPagination


class HistoryPagination(CursorPagination):
    """A Session's history reads in order: oldest first, `next` pages forward."""

    ordering = "id"


class SessionListPagination(CursorPagination):
    """Sessions newest first. Their ids are UUIDs (no order), so the cursor walks creation time."""

    ordering = ("-created_at", "-id")
