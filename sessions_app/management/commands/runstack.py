"""`manage.py runstack`: the whole product in one process tree.

Embedded mode (REDIS_URL unset): daphne (HTTP + WebSockets) and an in-process Celery
worker on the in-memory broker. Production (REDIS_URL set): daphne only; workers run
as `celery -A config worker` and `celery -A config beat`.
"""

import sys

from channels.routing import get_default_application
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.conf import settings
from django.core.management.base import BaseCommand

from config.embedded import start_embedded_worker
from sessions_app.runtime import brain, presence


class Command(BaseCommand):
    help = "Serve the web app (daphne) and, in embedded mode, an in-process Celery worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, host, port, **options):
        if settings.EMBEDDED:
            start_embedded_worker()
            # No beat in embedded mode: this process sweeps for lost runners itself (and its
            # presence row says it is alive while it runs slices).
            presence.ensure_started()
            brain.start_recovery_timer()
            mode = "embedded: SQLite/in-process worker/in-memory channel layer"
        else:
            mode = "web only: run workers with `celery -A config worker` and `celery -A config beat`"
        display_host = f"[{host}]" if ":" in host else host
        url = f"http://{display_host}:{port}/"

        def announce():
            self.stdout.write(f"xAgent workspace running at {url} ({mode})")
            sys.stdout.flush()

        Server(
            application=get_default_application(),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=announce,
            verbosity=0,
        ).run()
