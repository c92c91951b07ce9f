"""Streaming a model's answer to the Session's watchers: deltas coalesced into one `model.delta`
message per DELTA_FLUSH_S, redacted on the way (a secret split across deltas is still caught).
"""

from __future__ import annotations

import logging
import time

from tools_app.secrets import Redactor, StreamRedactor

from .events import broadcast_delta

logger = logging.getLogger(__name__)


DELTA_FLUSH_S = 0.05


class DeltaCoalescer:
    """Batches streamed text into one `model.delta` message per ~50 ms."""

    def __init__(self, session_id, model_call_id: int, redactor: Redactor | None = None):
        self.session_id, self.model_call_id = session_id, model_call_id
        self.buffer: list[str] = []
        self.last_flush = time.monotonic()
        # Holds back a tail so a secret split across deltas is still caught before it is sent.
        self.stream_redactor = StreamRedactor(redactor) if redactor else None

    def __call__(self, text: str) -> None:
        self.buffer.append(self.stream_redactor.feed(text) if self.stream_redactor else text)
        if time.monotonic() - self.last_flush >= DELTA_FLUSH_S:
            self.flush()

    def flush(self, final: bool = False) -> None:
        if final and self.stream_redactor is not None:
            self.buffer.append(self.stream_redactor.flush())
        if any(self.buffer):
            broadcast_delta(self.session_id, self.model_call_id, "".join(self.buffer))
            self.buffer.clear()
        self.last_flush = time.monotonic()
