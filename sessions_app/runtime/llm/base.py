"""The provider interface AgentService calls: one streamed chat completion."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


class Cancelled(Exception):
    """The user interrupted while the model was answering."""


class ModelCallFailed(Exception):
    """The provider refused or kept failing after retries; the turn ends `error`."""

    def __init__(self, message: str, attempts: int, attempt_errors: list[str]):
        super().__init__(message)
        self.attempts = attempts
        self.attempt_errors = attempt_errors


@dataclass
class ModelResult:
    text: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # [{"id", "name", "arguments"}], arguments raw
    finish_reason: str = ""
    usage: dict = field(default_factory=dict)
    attempts: int = 1
    attempt_errors: list[str] = field(default_factory=list)


class CancelSignal:
    """Set once by whoever notices an interrupt; watchers (stream closers) are told at once."""

    def __init__(self):
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def event(self) -> threading.Event:
        """The underlying event, for code that waits on a plain `threading.Event` (the sandbox)."""
        return self._event

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Register `callback`; returns a function that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None
        callback()
        return lambda: None

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


class EncodedMessages(list):
    """A request's messages (wire dicts, so any provider can iterate them) that also keep each
    message's JSON encoding, made once when it joined the slice's history: an HTTP provider
    splices them into the body instead of re-encoding the whole history every step."""

    def __init__(self):
        super().__init__()
        self._encoded: list[str] = []

    def append_encoded(self, wire: dict, encoded: str) -> None:
        super().append(wire)
        self._encoded.append(encoded)

    def set_first(self, wire: dict) -> None:
        encoded = json.dumps(wire, ensure_ascii=False)
        if self:
            self[0], self._encoded[0] = wire, encoded
        else:
            self.append_encoded(wire, encoded)

    def truncate(self, keep: int) -> None:
        del self[keep:]
        del self._encoded[keep:]

    def json_array(self) -> str:
        return "[" + ",".join(self._encoded) + "]"
