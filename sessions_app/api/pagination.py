from config.api import CursorPagination


class HistoryPagination(CursorPagination):
    """A Session's history reads in order: oldest first, `next` pages forward."""

    ordering = "id"
