"""Logging filters."""

import logging


class HandledAsWarning(logging.Filter):
    """For refusals the product answers itself (an oversized form gets a 413 page that names the
    limit): one WARNING line, not an ERROR with a traceback that reads like a crash."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True
