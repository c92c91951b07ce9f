"""The in-process Celery worker of embedded mode (ARCHITECTURE §9).

`runstack` starts it beside daphne so the same task code path (`.delay()` through the
broker) runs with no external service. It uses the `memory://` transport, which only
exists inside this process, so it must never be started when REDIS_URL is set.

`stop_embedded_worker` stops it before the interpreter exits: left running, its pool would
take tasks (a yielding slice re-enqueues its Session) into an executor the interpreter has
already shut down, which failed noisily and left that work to the next start's recovery.
"""

from __future__ import annotations

import logging
import socket
import threading
import warnings

from django.conf import settings

logger = logging.getLogger(__name__)

_worker_thread: threading.Thread | None = None
_lock = threading.Lock()


def start_embedded_worker() -> threading.Thread:
    """Start (once per process) a thread-pool Celery worker consuming the in-memory broker."""
    global _worker_thread
    if not settings.EMBEDDED:
        raise RuntimeError("The in-process worker runs only in embedded mode (REDIS_URL unset).")
    with _lock:
        if _worker_thread is not None and _worker_thread.is_alive():
            return _worker_thread
        from celery.platforms import SecurityWarning

        from config.celery import app

        # The embedded stack is a developer's single process; Celery's warning about running
        # as root is aimed at shared production workers and would only add noise here.
        warnings.filterwarnings("ignore", category=SecurityWarning)
        worker = app.Worker(
            pool="threads",
            concurrency=settings.XAGENT_EMBEDDED_WORKER_THREADS,
            loglevel="WARNING",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            hostname=f"embedded@{socket.gethostname()}",
            quiet=True,
        )
        _worker_thread = threading.Thread(target=worker.start, name="embedded-celery-worker", daemon=True)
        _worker_thread.start()
        logger.info("embedded Celery worker started (%s threads)", settings.XAGENT_EMBEDDED_WORKER_THREADS)
        return _worker_thread


def stop_embedded_worker(timeout: float) -> bool:
    """Stop the in-process worker as a warm shutdown would: stop consuming, let running slices
    reach their next step boundary and hand over (release the lease; the next start's recovery
    sweep picks their Sessions up), wait up to `timeout` seconds. True when it has stopped."""
    thread = _worker_thread
    if thread is None or not thread.is_alive():
        return True
    from celery.platforms import EX_OK
    from celery.worker import state

    from sessions_app.runtime.brain import hand_over_slices

    hand_over_slices()
    # What a SIGTERM handler sets: the worker's consumer loop sees it and shuts down warm.
    state.should_stop = EX_OK
    thread.join(timeout)
    return not thread.is_alive()
