"""Settings: every value comes from the environment (django-environ), `.env` if present.

Two ways to run (ARCHITECTURE §9), chosen by one fact — whether `REDIS_URL` is set:

* embedded (default, `make run`): SQLite in WAL mode under `var/`, an in-process Celery
  worker on the in-memory transport, the in-memory channel layer, dev-only secrets.
* production: `REDIS_URL` is the Celery broker, the channel layer and the cache;
  `DATABASE_URL` should be PostgreSQL; `SECRET_KEY` and `ALLOWED_HOSTS` must be given.

A bad value stops the process at import with a message naming the variable.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from config import sandbox_reach

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    env.read_env(str(BASE_DIR / ".env"), overwrite=False)


def _read(name: str, reader, default):
    """Read one variable; a value that does not parse names the variable in the error."""
    try:
        return reader(name, default=default)
    except (ValueError, TypeError, ImproperlyConfigured, environ.ImproperlyConfigured) as exc:
        raise ImproperlyConfigured(f"Invalid value for environment variable {name}: {exc}") from exc


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(name: str, default: bool) -> bool:
    """Strict boolean: "maybe" is an error, not a silent False."""
    raw = env.str(name, default="").strip().lower() if name in env.ENVIRON else None
    if raw is None:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"Invalid value for environment variable {name}: {raw!r} is not a boolean (true/false)"
    )


def _positive_int(name: str, default: int) -> int:
    value = _read(name, env.int, default)
    if value <= 0:
        raise ImproperlyConfigured(
            f"Invalid value for environment variable {name}: must be a positive integer"
        )
    return value


REDIS_URL: str = _read("REDIS_URL", env.str, "")
EMBEDDED = not REDIS_URL
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(
        f"Invalid value for environment variable REDIS_URL: {REDIS_URL!r} is not a redis:// URL"
    )

DEBUG = _bool("DEBUG", EMBEDDED)

_DEV_SECRET_KEY = "embedded-dev-only-" + "x" * 40
SECRET_KEY = _read("SECRET_KEY", env.str, _DEV_SECRET_KEY if EMBEDDED else "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "Environment variable SECRET_KEY is required when REDIS_URL is set (production mode)"
    )

ALLOWED_HOSTS = _read("ALLOWED_HOSTS", env.list, ["127.0.0.1", "localhost", "[::1]"] if EMBEDDED else [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "Environment variable ALLOWED_HOSTS is required when REDIS_URL is set (production mode)"
    )
CSRF_TRUSTED_ORIGINS = _read("CSRF_TRUSTED_ORIGINS", env.list, [])

# --- apps -------------------------------------------------------------------------------

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from our own static files: /api/docs/ works offline
    "channels",
    "axes",
    "tenancy_app",
    "approvals_app",
    "skills_app",
    "tools_app",
    "sessions_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # WhiteNoise that also runs async: with every middleware async-capable, a waiting long poll
    # occupies no thread (sessions_app/api/longpoll.py).
    "config.static_middleware.AsyncWhiteNoiseMiddleware",
    # A 404 outside /api/ and the admin is the product's page, also with DEBUG on.
    "config.middleware.ProductNotFoundMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # /api/ only: 413 for declared oversized bodies, 400 for NUL in the path/query, JSON 404s
    # even with DEBUG on. Before CommonMiddleware so its slash redirect never sees an API POST.
    "config.middleware.ApiRequestGuardMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Who acts and from where, for the audit log its owners write (tenancy_app/audit.py).
    "tenancy_app.audit.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout answer.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # Counts failed logins and refuses further attempts once the limit is reached.
    "axes.backends.AxesStandaloneBackend",
    # Passwords, unless every tenant of the user turned them off (single sign-on only).
    "tenancy_app.backends.PasswordBackend",
    "tenancy_app.backends.SingleSignOnBackend",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenancy_app.context_processors.current_tenant",
                "tenancy_app.context_processors.sign_in",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------------------

DATABASES = {"default": _read("DATABASE_URL", env.db_url, f"sqlite:///{VAR_DIR / 'db.sqlite3'}")}
_SUPPORTED_ENGINES = {"django.db.backends.sqlite3", "django.db.backends.postgresql"}
if DATABASES["default"].get("ENGINE") not in _SUPPORTED_ENGINES:
    raise ImproperlyConfigured(
        "Invalid value for environment variable DATABASE_URL: use postgres://user:password@host:port/name "
        "or sqlite:////absolute/path.sqlite3"
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers (web, long polls) run beside the single writer; IMMEDIATE takes
    # the write lock at BEGIN so two writers queue on the busy timeout instead of
    # failing mid-transaction with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        }
    )
    # Tests use a file too (not shared-cache memory), so threads see SQLite's real locking:
    # writers wait on the busy timeout instead of failing with "table is locked".
    DATABASES["default"].setdefault("TEST", {"NAME": str(VAR_DIR / f"test_db_{os.getpid()}.sqlite3")})
    _db_name = str(DATABASES["default"]["NAME"])
    if _db_name and _db_name != ":memory:":
        Path(_db_name).parent.mkdir(parents=True, exist_ok=True)
else:
    # One bounded connection pool per process (psycopg_pool through Django): a worker thread hands
    # its connection back before every wait (config/dbconn.py), so a process driving hundreds of
    # Sessions holds only a few connections. Web processes take XAGENT_DB_POOL_SIZE; a Celery worker
    # process takes XAGENT_WORKER_DB_CONNECTIONS (config/celery.py). 0 turns pooling off (then one
    # connection per thread, CONN_MAX_AGE applies).
    XAGENT_DB_POOL_SIZE = _read("XAGENT_DB_POOL_SIZE", env.int, 10)
    XAGENT_DB_POOL_TIMEOUT = _read("XAGENT_DB_POOL_TIMEOUT", env.float, 60.0)
    if XAGENT_DB_POOL_SIZE < 0 or XAGENT_DB_POOL_TIMEOUT <= 0:
        raise ImproperlyConfigured(
            "Invalid value for environment variable XAGENT_DB_POOL_SIZE or XAGENT_DB_POOL_TIMEOUT: "
            "the size must be 0 (no pool) or more, the timeout positive"
        )
    if XAGENT_DB_POOL_SIZE:
        if _read("CONN_MAX_AGE", env.int, 0):
            raise ImproperlyConfigured(
                "Invalid value for environment variable CONN_MAX_AGE: connections are pooled "
                "(XAGENT_DB_POOL_SIZE); set XAGENT_DB_POOL_SIZE=0 to use persistent connections instead"
            )
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        # psycopg_pool discards a connection that came back broken; a check on every checkout
        # would cost a round trip each time a waiting thread takes one again.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": XAGENT_DB_POOL_SIZE,
            "timeout": XAGENT_DB_POOL_TIMEOUT,
        }
    else:
        DATABASES["default"].setdefault("CONN_MAX_AGE", _read("CONN_MAX_AGE", env.int, 0))
        DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
    # Prepared statements: a runner's step sends the same dozen statements every time, and
    # PostgreSQL parsing and planning them anew cost more of its CPU than running them (`make
    # bench` slow_model, N = 200: 1.4 s of planning per run, 0.2 s prepared). Server-side binding
    # lets psycopg prepare a statement on a connection once it has run five times there. Off
    # behind a pooler that cannot keep them (PgBouncer in transaction mode before 1.21).
    XAGENT_DB_PREPARED_STATEMENTS = _read("XAGENT_DB_PREPARED_STATEMENTS", env.bool, True)
    if XAGENT_DB_PREPARED_STATEMENTS:
        DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- cache, channel layer, celery ---------------------------------------------------------

if EMBEDDED:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "config.channel_layer.ThreadSafeInMemoryChannelLayer"}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "xagent",
        }
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "config.channel_layer.RedisChannelLayer",
            # redis-py's default read timeout (5 s) equals channels_redis's blocking-pop timeout
            # (5 s), so an idle receive could fail with "Timeout reading"; give reads headroom.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                "prefix": "xagent:channels",
            },
        }
    }

# Consumed by config/celery.py through `config_from_object(..., namespace="CELERY")`.
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True  # nothing in the product waits on a task result
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# A slice of agent work is bounded (ARCHITECTURE §3); the visibility timeout must stay
# longer than any slice or Redis would redeliver a task that is still running.
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {"polling_interval": 0.005}
    if EMBEDDED
    else {"visibility_timeout": _positive_int("XAGENT_VISIBILITY_TIMEOUT", 3600)}
)
# How often the recovery sweep runs (beat here; a timer thread in embedded mode).
XAGENT_RECOVERY_SWEEP_SECONDS = _positive_int("XAGENT_RECOVERY_SWEEP_SECONDS", 5)
# A slice stops itself after SLICE_MAX_SECONDS (30 s) at a step boundary, but one step can run a
# shell command of up to tools_app.native.shell.MAX_TIMEOUT_SECONDS (600 s) or a slow model call.
# The soft limit ends a slice that overran even that (its turn ends `error`); the hard limit
# kills the pool process if the soft one was not honoured. Both are enforced by the prefork pool
# only: the threads pool (embedded mode, `--pool threads`) cannot stop a thread.
XAGENT_SLICE_SOFT_TIME_LIMIT = _positive_int("XAGENT_SLICE_SOFT_TIME_LIMIT", 900)
XAGENT_SLICE_TIME_LIMIT = _positive_int("XAGENT_SLICE_TIME_LIMIT", 960)
if XAGENT_SLICE_TIME_LIMIT <= XAGENT_SLICE_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        "Invalid value for environment variable XAGENT_SLICE_TIME_LIMIT: must be greater than "
        "XAGENT_SLICE_SOFT_TIME_LIMIT"
    )
if not EMBEDDED and XAGENT_SLICE_TIME_LIMIT >= CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]:
    # Redis would hand a still-running slice's task to a second worker.
    raise ImproperlyConfigured(
        "Invalid value for environment variable XAGENT_SLICE_TIME_LIMIT: must be smaller than "
        "XAGENT_VISIBILITY_TIMEOUT"
    )
CELERY_TASK_ANNOTATIONS = {
    "sessions.drive_session": {
        "soft_time_limit": XAGENT_SLICE_SOFT_TIME_LIMIT,
        "time_limit": XAGENT_SLICE_TIME_LIMIT,
    }
}
# A runner lost this many times in a row at the same point of a turn (its worker died each
# time: OOM, segfault, hard time limit) ends the turn `error` instead of killing the next worker.
XAGENT_POISON_SLICE_ATTEMPTS = _positive_int("XAGENT_POISON_SLICE_ATTEMPTS", 3)
# Cold shutdown (SIGQUIT, or SIGTERM with REMAP_SIGTERM=SIGQUIT) first waits this long for running
# slices: a slice stops at its next step boundary once the worker is shutting down (brain.drive),
# so slightly more than a slice's budget lets almost every slice hand over cleanly. Without
# running tasks the worker does not wait (worker_enable_soft_shutdown_on_idle stays off: the only
# messages it holds then are countdown sweeps, which Redis redelivers anyway).
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = float(_positive_int("XAGENT_WORKER_SOFT_SHUTDOWN_SECONDS", 45))
CELERY_BEAT_SCHEDULE = {
    # Wake Sessions whose runner vanished (worker killed, task lost): ARCHITECTURE §6.
    # Every few seconds: cheap (three small queries when nothing is wrong), and it bounds how
    # long a turn whose worker died waits (runtime/presence.py).
    "recover-stale-sessions": {
        "task": "sessions.recover",
        "schedule": float(XAGENT_RECOVERY_SWEEP_SECONDS),
        # A sweep that waited behind busy workers longer than the next one is useless.
        "options": {"expires": float(XAGENT_RECOVERY_SWEEP_SECONDS)},
    },
    "expire-approvals": {"task": "sessions.expire_approvals", "schedule": 60.0},
}
# A worker process drives this many Sessions at once (Celery's threads pool): a Session waiting on
# its model or on an I/O-bound tool holds a thread, which costs memory (≈ a few hundred KiB), not
# a CPU. The embedded in-process worker uses the same pool (XAGENT_EMBEDDED_WORKER_THREADS).
XAGENT_WORKER_SESSIONS = _positive_int("XAGENT_WORKER_SESSIONS", 200)
# `prefork` (one Session per process, Celery's time limits enforced) is still there for whoever
# wants it; Celery ignores `--pool prefork` on the command line when the configuration names a
# pool, so it is chosen here. Its concurrency then defaults to the CPU count (or --concurrency).
XAGENT_WORKER_POOL = _read("XAGENT_WORKER_POOL", env.str, "threads")
if XAGENT_WORKER_POOL not in ("threads", "prefork", "solo"):
    raise ImproperlyConfigured(
        "Invalid value for environment variable XAGENT_WORKER_POOL: use threads, prefork or solo"
    )
CELERY_WORKER_POOL = XAGENT_WORKER_POOL
if XAGENT_WORKER_POOL == "threads":
    CELERY_WORKER_CONCURRENCY = XAGENT_WORKER_SESSIONS
# Connections of one worker process's pool (PostgreSQL): its threads share them, each holding
# one only between waits. 2 keeps a deployment's connections at ≈ 2 per worker process.
XAGENT_WORKER_DB_CONNECTIONS = _positive_int("XAGENT_WORKER_DB_CONNECTIONS", 2)
# A step (one model call and the tools it asks for) that runs longer than this is stopped, in
# every pool (runtime/watch.py): its turn ends `error`, or, when a tool ignores the stop, its lease
# lapses and recovery settles the call. Longer than a shell command may run (600 s).
XAGENT_STEP_TIME_LIMIT = _positive_int("XAGENT_STEP_TIME_LIMIT", 900)
# Running Sessions per tenant at once; the tenant's other Sessions wait as `queued` (reason
# `tenant_limit`) until one of its runners is done, so one tenant cannot take every thread.
XAGENT_TENANT_MAX_RUNNING = _positive_int("XAGENT_TENANT_MAX_RUNNING", 200)

# Sign-in with an OpenID Connect provider (tenancy_app/oidc.py); off while the issuer is empty.
XAGENT_OIDC_ISSUER = env.str("XAGENT_OIDC_ISSUER", default="").rstrip("/")
XAGENT_OIDC_CLIENT_ID = env.str("XAGENT_OIDC_CLIENT_ID", default="")
XAGENT_OIDC_CLIENT_SECRET = env.str("XAGENT_OIDC_CLIENT_SECRET", default="")
XAGENT_OIDC_SCOPES = env.str("XAGENT_OIDC_SCOPES", default="openid profile email groups")
XAGENT_OIDC_NAME = env.str("XAGENT_OIDC_NAME", default="single sign-on")
XAGENT_OIDC_GROUPS_CLAIM = env.str("XAGENT_OIDC_GROUPS_CLAIM", default="groups")
# Which groups make whom a member of which tenant: "group=tenant-slug:role, …" (role: owner,
# admin or member; several rules for one tenant: the highest role wins).
XAGENT_OIDC_ROLE_RULES = env.str("XAGENT_OIDC_ROLE_RULES", default="")
XAGENT_OIDC_TIMEOUT = env.float("XAGENT_OIDC_TIMEOUT", default=10.0)
# The currency ModelConfig prices are in and usage costs are reported in (`/usage/`).
XAGENT_USAGE_CURRENCY = env.str("XAGENT_USAGE_CURRENCY", default="USD")
XAGENT_EMBEDDED_WORKER_THREADS = _positive_int("XAGENT_EMBEDDED_WORKER_THREADS", 100)

# --- auth, i18n, static -------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failures for one username from one
# address, that pair is locked out for AXES_COOLOFF_TIME hours. Counters live in the database.
AXES_FAILURE_LIMIT = _positive_int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = _read("AXES_COOLOFF_TIME", env.float, 0.25)  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
AXES_LOCKOUT_TEMPLATE = "registration/lockout.html"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if EMBEDDED
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
# Embedded mode serves static files straight from the apps (no collectstatic step).
WHITENOISE_USE_FINDERS = EMBEDDED
WHITENOISE_AUTOREFRESH = EMBEDDED

# --- security (production) -----------------------------------------------------------------

# Production sits behind TLS; a deployment that terminates TLS elsewhere or serves plain
# HTTP on loopback (CI) turns this off explicitly with XAGENT_HTTPS=false.
XAGENT_HTTPS = _bool("XAGENT_HTTPS", not EMBEDDED)
if XAGENT_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = _read("SECURE_HSTS_SECONDS", env.int, 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"  # views that must be framed (file previews) opt in one by one

# --- secrets at rest -------------------------------------------------------------------------

_secrets_key = _read("XAGENT_SECRETS_KEY", env.str, "")
if not _secrets_key:
    if not EMBEDDED:
        raise ImproperlyConfigured(
            "Environment variable XAGENT_SECRETS_KEY is required when REDIS_URL is set (production mode); "
            "generate one with: .venv/bin/python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
        )
    _secrets_key = base64.urlsafe_b64encode(
        hashlib.sha256(("xagent-secrets:" + SECRET_KEY).encode()).digest()
    ).decode()
XAGENT_SECRETS_KEY = _secrets_key
try:
    if len(base64.urlsafe_b64decode(XAGENT_SECRETS_KEY.encode())) != 32:
        raise ValueError("must decode to 32 bytes")
except ValueError as exc:
    raise ImproperlyConfigured(
        f"Invalid value for environment variable XAGENT_SECRETS_KEY: a Fernet key (32 url-safe base64 bytes) is required ({exc})"
    ) from exc

# --- model defaults and workspaces -----------------------------------------------------------

OPENAI_BASE_URL = _read("OPENAI_BASE_URL", env.str, "")
OPENAI_API_KEY = _read("OPENAI_API_KEY", env.str, "")
# A model that runs in this process (dotted path of a provider class taking an EffectiveModel,
# see sessions_app/runtime/llm/providers.py) serves Sessions with no ModelConfig instead of the
# environment's OpenAI endpoint or the demo model: `make bench` uses a zero-latency one. Operator
# only; a tenant cannot choose it.
XAGENT_MODEL_PROVIDER = _read("XAGENT_MODEL_PROVIDER", env.str, "")
XAGENT_MODEL = _read("XAGENT_MODEL", env.str, "")
XAGENT_CONTEXT_WINDOW = _positive_int("XAGENT_CONTEXT_WINDOW", 128000)
XAGENT_MAX_OUTPUT_TOKENS = _positive_int("XAGENT_MAX_OUTPUT_TOKENS", 4096)
if XAGENT_MAX_OUTPUT_TOKENS >= XAGENT_CONTEXT_WINDOW:
    raise ImproperlyConfigured(
        "Invalid value for environment variable XAGENT_MAX_OUTPUT_TOKENS: must be smaller than XAGENT_CONTEXT_WINDOW"
    )
# Context budget (ARCHITECTURE §5): a request may hold context_window - max_output_tokens - margin
# tokens, the margin being at least this (and at least 5% of the window). Counted from the
# provider's reported usage plus a local estimate; XAGENT_TOKEN_ESTIMATOR names a replacement
# estimator, a dotted path to `callable(text) -> int` (sessions_app/runtime/llm/tokens.py).
XAGENT_CONTEXT_MARGIN_TOKENS = _positive_int("XAGENT_CONTEXT_MARGIN_TOKENS", 256)
XAGENT_TOKEN_ESTIMATOR = _read("XAGENT_TOKEN_ESTIMATOR", env.str, "")
# A summary call (compaction) waits at most this long for a byte, and is retried once; then the
# compaction falls back to a deterministic trim.
XAGENT_SUMMARY_TIMEOUT_SECONDS = _positive_int("XAGENT_SUMMARY_TIMEOUT_SECONDS", 60)
# The outer task loop's calls (task relation, orchestration) wait at most this long for their
# answer, and are retried once; then the turn runs without them (an `error` event says why).
XAGENT_PREPARE_TIMEOUT_SECONDS = _positive_int("XAGENT_PREPARE_TIMEOUT_SECONDS", 30)
# Orchestration's three recalls (Skills, tools, memories) are independent and ranked so that
# completion order never matters; on, they run side by side in threads (each its own database
# connection). Off by default: measured (`make bench`, scenario 9) each thread's new connection
# costs more than running three ~1 ms queries one after the other (PostgreSQL 80.6 vs 56.0 ms per
# preparation). Worth turning on when a recall source is slow or remote.
XAGENT_RECALL_PARALLEL = _read("XAGENT_RECALL_PARALLEL", env.bool, False)
# Outbound guard (tools_app/net.py): tenant-configured endpoints (Streamable HTTP MCP servers,
# model base URLs) may not reach loopback, link-local, private, multicast or metadata addresses
# unless the operator lists the host here ("host" or "host:port", comma-separated).
XAGENT_OUTBOUND_ALLOWED_HOSTS = _read("XAGENT_OUTBOUND_ALLOWED_HOSTS", env.list, [])
# The address people reach this workspace at (scheme://host[:port]). It makes the OAuth
# redirect URI registered with MCP servers' authorization servers (<this>/mcp/oauth/callback/);
# unset, the address an admin's browser used for Connect is taken.
XAGENT_PUBLIC_URL = _read("XAGENT_PUBLIC_URL", env.str, "").rstrip("/")
if XAGENT_PUBLIC_URL and not XAGENT_PUBLIC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"Invalid value for environment variable XAGENT_PUBLIC_URL: {XAGENT_PUBLIC_URL!r} is not an http(s) URL"
    )
# Pooled MCP sessions (tools_app/mcp/pool.py): one per server configuration per process, closed
# after being idle this long, checked with one cheap request before reuse after this long, and
# reconnected with exponential backoff capped here. Off: every tool call opens its own connection.
XAGENT_MCP_POOL = _bool("XAGENT_MCP_POOL", True)
XAGENT_MCP_IDLE_SECONDS = _positive_int("XAGENT_MCP_IDLE_SECONDS", 300)
XAGENT_MCP_HEALTH_AFTER_SECONDS = _positive_int("XAGENT_MCP_HEALTH_AFTER_SECONDS", 30)
XAGENT_MCP_RECONNECT_MAX_SECONDS = _positive_int("XAGENT_MCP_RECONNECT_MAX_SECONDS", 30)
# Notifications that a server's tools changed, within this many seconds, make one refresh.
XAGENT_MCP_LIST_CHANGED_DEBOUNCE_SECONDS = _read("XAGENT_MCP_LIST_CHANGED_DEBOUNCE_SECONDS", env.float, 1.0)
# Where a root process keeps what its sandbox must reach when this checkout is private (a
# `mktemp -d` folder, /root/…): config/sandbox_reach.py. The default roots below move there only
# when they are defaults, this process is root, and the sandbox uids cannot search a directory
# above <checkout>/var; a root set in the environment stays as given (and is refused if out of reach).
XAGENT_SANDBOX_DATA_DIR = Path(
    _read("XAGENT_SANDBOX_DATA_DIR", env.str, "") or sandbox_reach.default_data_dir(BASE_DIR)
)
_SANDBOX_ROOTS_GIVEN = {"XAGENT_WORKSPACES_DIR", "XAGENT_MCP_SERVERS_DIR"} <= set(env.ENVIRON)
XAGENT_SANDBOX_DEFAULTS_MOVED = not _SANDBOX_ROOTS_GIVEN and sandbox_reach.out_of_reach(
    VAR_DIR / "workspaces"
)
if XAGENT_SANDBOX_DEFAULTS_MOVED:
    sandbox_reach.prepare_data_dir(XAGENT_SANDBOX_DATA_DIR)
_SANDBOX_DEFAULTS_DIR = XAGENT_SANDBOX_DATA_DIR if XAGENT_SANDBOX_DEFAULTS_MOVED else VAR_DIR
XAGENT_WORKSPACES_DIR = Path(
    _read("XAGENT_WORKSPACES_DIR", env.str, str(_SANDBOX_DEFAULTS_DIR / "workspaces"))
)
# stdio MCP servers run sandboxed, each with its own directory <this>/<tenant id>/<server id>
# (its working directory and HOME). Like the workspaces root, its parents must be searchable
# (o+x) by the sandbox uids (XAGENT_SANDBOX_UIDS).
XAGENT_MCP_SERVERS_DIR = Path(
    _read("XAGENT_MCP_SERVERS_DIR", env.str, str(_SANDBOX_DEFAULTS_DIR / "mcp-servers"))
)


# The unprivileged uids a root worker drops to, one per running sandbox (shell_exec, stdio MCP
# servers; gid = uid), as "FIRST-LAST" (tools_app/sandbox/identity.py). RLIMIT_NPROC counts every
# process of a uid on the host, so each sandbox's process limit is its own only if no other
# daemon uses these uids: pick a range no account has. Its size bounds the sandboxes running at
# once on one host. Which uid is taken is an flock in XAGENT_SANDBOX_LOCK_DIR, shared by every
# process of the host.
def _uid_range(name: str, default: str) -> tuple[int, int]:
    raw = _read(name, env.str, default).strip()
    first, sep, last = raw.partition("-")
    try:
        bounds = (int(first), int(last) if sep else int(first))
    except ValueError:
        raise ImproperlyConfigured(
            f"Invalid value for environment variable {name}: {raw!r} is not FIRST-LAST (e.g. 200000-200999)"
        ) from None
    if not 1000 <= bounds[0] <= bounds[1] < 2**31 - 1:
        raise ImproperlyConfigured(
            f"Invalid value for environment variable {name}: {raw!r} must be uids from 1000 up, FIRST <= LAST"
        )
    return bounds


XAGENT_SANDBOX_UIDS = _uid_range("XAGENT_SANDBOX_UIDS", "200000-200999")
XAGENT_SANDBOX_LOCK_DIR = Path(_read("XAGENT_SANDBOX_LOCK_DIR", env.str, "/run/xagent/sandbox-uids"))
# The operator's ceilings on every SandboxPolicy (a tenant's policy only narrows them): saving a
# policy above one is refused, and a policy saved before a ceiling was lowered is clamped when
# it is applied. Keep the wall-clock ceiling below XAGENT_SLICE_SOFT_TIME_LIMIT (as the defaults
# are), so a command ends before its slice is stopped.
XAGENT_SANDBOX_CEILINGS = {
    "cpu_seconds": _positive_int("XAGENT_SANDBOX_MAX_CPU_SECONDS", 600),
    "memory_mb": _positive_int("XAGENT_SANDBOX_MAX_MEMORY_MB", 4096),
    "wall_seconds": _positive_int("XAGENT_SANDBOX_MAX_WALL_SECONDS", 600),
    "max_processes": _positive_int("XAGENT_SANDBOX_MAX_PROCESSES", 256),
    "max_file_size_mb": _positive_int("XAGENT_SANDBOX_MAX_FILE_SIZE_MB", 1024),
    "max_output_bytes": _positive_int("XAGENT_SANDBOX_MAX_OUTPUT_BYTES", 1_000_000),
}
# Egress of a sandbox whose policy allows network (tools_app/sandbox/egress.py): the ports a
# command may reach on public addresses (a host:port the operator lists in
# XAGENT_OUTBOUND_ALLOWED_HOSTS is reachable whatever its port).
XAGENT_SANDBOX_EGRESS_PORTS = [int(p) for p in _read("XAGENT_SANDBOX_EGRESS_PORTS", env.list, ["80", "443"])]
# Loop guards of a turn (AgentService): the same failing call this many times in a row, this
# many rounds of tool calls without progress, or this many steps end the turn `blocked`.
XAGENT_LOOP_GUARD_REPEATS = _positive_int("XAGENT_LOOP_GUARD_REPEATS", 3)
XAGENT_LOOP_GUARD_IDLE_ROUNDS = _positive_int("XAGENT_LOOP_GUARD_IDLE_ROUNDS", 6)
XAGENT_MAX_STEPS_PER_TURN = _positive_int("XAGENT_MAX_STEPS_PER_TURN", 100)
# Recall (skills_find, memory_search, memories at task setup): a dotted path to a scorer class
# (skills_app/recall.py `Scorer`); the default is BM25 over names and descriptions / texts.
XAGENT_RECALL_SCORER = _read("XAGENT_RECALL_SCORER", env.str, "skills_app.recall.BM25Scorer")
# Long-term memories one user may keep in one tenant (memory_save refuses past it).
XAGENT_MEMORY_MAX_PER_USER = _positive_int("XAGENT_MEMORY_MAX_PER_USER", 1000)
# A runner holds a Session's lease this long past its last write or heartbeat; a runner lost
# with its worker (a crash, SIGKILL) is replaced once it lapses.
XAGENT_RUNNER_LEASE_SECONDS = _positive_int("XAGENT_RUNNER_LEASE_SECONDS", 60)
# How long an MCP server's question (elicitation) waits for a person before it is declined.
# The tool call waits inside the slice: a wait the slice's soft limit cuts short would end the
# turn `error` instead of declining the question (so the default stays a minute below it).
XAGENT_ELICITATION_TIMEOUT_SECONDS = _positive_int(
    "XAGENT_ELICITATION_TIMEOUT_SECONDS", min(600, max(1, XAGENT_SLICE_SOFT_TIME_LIMIT - 60))
)
if XAGENT_ELICITATION_TIMEOUT_SECONDS >= XAGENT_SLICE_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        "Invalid value for environment variable XAGENT_ELICITATION_TIMEOUT_SECONDS: must be smaller "
        "than XAGENT_SLICE_SOFT_TIME_LIMIT"
    )
# Faster than the lease (runtime/presence.py): every process that runs slices refreshes a
# presence row this often; a lease holder not seen for the timeout (or, on this host, whose
# process is gone) has its lease expired by the next recovery sweep, run this often (beat in
# production, a timer thread in embedded mode). Worst case for a crashed turn to resume on
# another host: timeout + sweep interval; on the same host, the next sweep.
XAGENT_PRESENCE_BEAT_SECONDS = _positive_int("XAGENT_PRESENCE_BEAT_SECONDS", 3)
XAGENT_PRESENCE_TIMEOUT_SECONDS = _positive_int("XAGENT_PRESENCE_TIMEOUT_SECONDS", 10)
if XAGENT_PRESENCE_TIMEOUT_SECONDS < 2 * XAGENT_PRESENCE_BEAT_SECONDS:
    raise ImproperlyConfigured(
        "Invalid value for environment variable XAGENT_PRESENCE_TIMEOUT_SECONDS: must be at least "
        "twice XAGENT_PRESENCE_BEAT_SECONDS (one late beat must not declare a live worker gone)"
    )
# What a person may put in a workspace through the files API (413/400 beyond; the model's own
# file tools have their per-file limits in tools_app.workspace).
XAGENT_UPLOAD_MAX_BYTES = _positive_int("XAGENT_UPLOAD_MAX_BYTES", 25 * 1024 * 1024)
XAGENT_WORKSPACE_MAX_FILES = _positive_int("XAGENT_WORKSPACE_MAX_FILES", 2000)
XAGENT_WORKSPACE_MAX_BYTES = _positive_int("XAGENT_WORKSPACE_MAX_BYTES", 500 * 1024 * 1024)
# What one Skill package may hold (folder or zip, SKILL.md included): files, and bytes counted
# while decompressing (a zip's declared sizes are not trusted).
XAGENT_SKILL_MAX_FILES = _positive_int("XAGENT_SKILL_MAX_FILES", 100)
XAGENT_SKILL_MAX_BYTES = _positive_int("XAGENT_SKILL_MAX_BYTES", 5 * 1024 * 1024)

# --- REST framework ----------------------------------------------------------------------------

# Request limits: a body over DATA_UPLOAD_MAX_MEMORY_SIZE answers 413 `payload_too_large`;
# JSON nested deeper than XAGENT_JSON_MAX_DEPTH answers 400.
DATA_UPLOAD_MAX_MEMORY_SIZE = _positive_int("XAGENT_MAX_BODY_BYTES", 2_621_440)
# The first handler notes each file's name as sent, so an upload kept under a shorter name says so.
FILE_UPLOAD_HANDLERS = [
    "sessions_app.upload_names.RequestedUploadNames",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
XAGENT_JSON_MAX_DEPTH = _positive_int("XAGENT_JSON_MAX_DEPTH", 32)
# Long polls (`GET …/events/?wait=`) hold no database connection while waiting; this bounds
# how many one API key (or browser user) may hold open at once. Beyond it: 429 `throttled`.
XAGENT_LONG_POLL_MAX_PER_KEY = _positive_int("XAGENT_LONG_POLL_MAX_PER_KEY", 10)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First class decides the WWW-Authenticate header, so anonymous API calls get 401.
        "tenancy_app.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenancy_app.permissions.IsTenantMember"],
    "DEFAULT_PAGINATION_CLASS": "config.api.CursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "config.api.exception_handler",
    # Documents each operation's error responses (the CONTRACT `Error` shape) in the schema.
    "DEFAULT_SCHEMA_CLASS": "config.schema.AutoSchema",
    # JSON only, with a nesting-depth limit. The upload route sets its own MultiPartParser
    # (daphne leaves form bodies to Django: config/daphne_forms.py).
    "DEFAULT_PARSER_CLASSES": ["config.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Per API key (or per browser user when no key is used); 429 `throttled` beyond the rate.
    # and per user across all their keys.
    "DEFAULT_THROTTLE_CLASSES": [
        "tenancy_app.throttling.ApiKeyRateThrottle",
        "tenancy_app.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "api_key": _read("XAGENT_THROTTLE_RATE", env.str, "1200/min"),
        "user": _read("XAGENT_THROTTLE_USER_RATE", env.str, "3000/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "xAgent workspace API",
    "DESCRIPTION": "Long-lived LLM agent Sessions: inputs, events, approvals, files. "
    "Authenticate with `Authorization: Bearer <api key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # The schema describes the API, not any tenant's data: integrators read it before they have a key.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several resources have a `source`; each enumeration gets its own component name.
    "ENUM_NAME_OVERRIDES": {
        "SkillSourceEnum": "skills_app.choices.SkillSource",
        "SessionKindEnum": "sessions_app.choices.SessionKind",
        "SessionStatusEnum": "sessions_app.choices.SessionStatus",
    },
}

# --- logging -----------------------------------------------------------------------------------

LOG_LEVEL = _read("LOG_LEVEL", env.str, "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"handled_as_warning": {"()": "config.log_filters.HandledAsWarning"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        "console_handled": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["handled_as_warning"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's own default gives `django` a console handler of its own under DEBUG, which
        # printed every warning twice beside the root's: one handler, the root's format.
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Answered by config.views.bad_request with a page (browser) or a 413 (API).
        "django.security.RequestDataTooBig": {"handlers": ["console_handled"], "propagate": False},
        "django.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "celery": {"level": "WARNING" if EMBEDDED else LOG_LEVEL},
        "httpx2": {"level": "WARNING"},  # one INFO line per HTTP request (model and MCP calls) is noise
    },
}
