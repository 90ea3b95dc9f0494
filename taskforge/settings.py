"""Django settings for TaskForge.

Every value comes from the environment and is declared here, one line each,
with its type and default (the TASKFORGE_* tunables included).
Secure by default: DEBUG is off and SECRET_KEY and DATABASE_URL are required.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured

from taskforge.lib import netblocks
from taskforge.lib.logging import lean_records
from taskforge.lib.redisconn import is_cluster, is_sentinel

# Django's generic classes (ModelAdmin, QuerySet, Paginator, forms) accept type
# arguments at run time, as the type checker reads them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.FileAwareEnv(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]"]),
    REDIS_URL=(str, "redis://127.0.0.1:6379/0"),
    LOG_LEVEL=(str, "INFO"),
)

DEBUG = env("DEBUG")
# Required unless DEBUG: a deployment without its own key must not start.
SECRET_KEY = env("SECRET_KEY", default="insecure-debug-only-key" if DEBUG else environ.Env.NOTSET)
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

# TaskForge's tunables. Code reads them through `taskforge.conf.conf` at call
# time (`conf.BUFFER_SIZE`), so tests can change them with the `settings` fixture;
# conf lists the same names and types, and a test keeps the two in step.
# The server's TASKFORGE_BIND, _WEB_WORKERS, _WEB_THREADS and timeouts are read by
# taskforge.api.server only (run_api and gunicorn.conf.py): before Django loads.
TASKFORGE_MAX_REQUEST_BYTES: int = env.int("TASKFORGE_MAX_REQUEST_BYTES", default=10_485_760)
TASKFORGE_MAX_PAYLOAD_BYTES: int = env.int("TASKFORGE_MAX_PAYLOAD_BYTES", default=262_144)
TASKFORGE_RETRY_BASE_MS: int = env.int("TASKFORGE_RETRY_BASE_MS", default=1000)
TASKFORGE_RETRY_MAX_DELAY_MS: int = env.int("TASKFORGE_RETRY_MAX_DELAY_MS", default=3_600_000)
TASKFORGE_SCHEDULER_TICK_SECONDS: float = env.float("TASKFORGE_SCHEDULER_TICK_SECONDS", default=1.0)
# The dispatcher's fallback pass; a NOTIFY wakes it sooner.
TASKFORGE_DISPATCHER_TICK_SECONDS: float = env.float(
    "TASKFORGE_DISPATCHER_TICK_SECONDS", default=1.0
)
# Buffered (claimed) tasks per queue in Redis.
TASKFORGE_BUFFER_SIZE: int = env.int("TASKFORGE_BUFFER_SIZE", default=1000)
TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS: float = env.float(
    "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS", default=30.0
)
TASKFORGE_WATCHDOG_INTERVAL_SECONDS: float = env.float(
    "TASKFORGE_WATCHDOG_INTERVAL_SECONDS", default=15.0
)
TASKFORGE_BUFFER_RECONCILE_SECONDS: float = env.float(
    "TASKFORGE_BUFFER_RECONCILE_SECONDS", default=30.0
)
# 0: a loop never gives up on its own.
TASKFORGE_MAX_TICK_FAILURES: int = env.int("TASKFORGE_MAX_TICK_FAILURES", default=0)
# Finished tasks are deleted with their events this long after finishing (0: kept forever).
TASKFORGE_RETENTION_SECONDS: int = env.int("TASKFORGE_RETENTION_SECONDS", default=604800)
TASKFORGE_DLQ_RETENTION_SECONDS: int = env.int("TASKFORGE_DLQ_RETENTION_SECONDS", default=2592000)
# The watchdog vacuums a task table past this many dead rows (tasks.vacuum; 0: never).
TASKFORGE_VACUUM_DEAD_ROWS: int = env.int("TASKFORGE_VACUUM_DEAD_ROWS", default=20000)
TASKFORGE_METRICS_TOKEN: str = env.str("TASKFORGE_METRICS_TOKEN", default="")
# A worker not seen for this long has no series in /metrics any more.
TASKFORGE_WORKER_FORGET_SECONDS: float = env.float(
    "TASKFORGE_WORKER_FORGET_SECONDS", default=3600.0
)
# Push delivery (run_pusher): the key of the TaskForge-Signature header (unset: no
# signature), and the requests one push process keeps in flight at once.
TASKFORGE_PUSH_SIGNING_SECRET: str = env.str("TASKFORGE_PUSH_SIGNING_SECRET", default="")
TASKFORGE_PUSH_MAX_IN_FLIGHT: int = env.int("TASKFORGE_PUSH_MAX_IN_FLIGHT", default=200)
# The Cloud Tasks API (API-cloudtasks.md): how long a finished named task's ID stays
# taken (0: free once finished), and the largest task it accepts (body, URL, headers,
# OIDC fields).
TASKFORGE_CLOUDTASKS_DEDUP_SECONDS: int = env.int(
    "TASKFORGE_CLOUDTASKS_DEDUP_SECONDS", default=3600
)
TASKFORGE_CLOUDTASKS_MAX_TASK_BYTES: int = env.int(
    "TASKFORGE_CLOUDTASKS_MAX_TASK_BYTES", default=1_048_576
)
# The `iss` of the OIDC ID tokens push requests carry (a URL, no trailing slash);
# empty: http://<TASKFORGE_BIND>, a wildcard host written localhost.
TASKFORGE_OIDC_ISSUER: str = env.str("TASKFORGE_OIDC_ISSUER", default="")
# The Sentinels' own password, for a `redis+sentinel://` REDIS_URL whose Sentinels
# need one (the URL's password is the master's); empty: none.
TASKFORGE_REDIS_SENTINEL_PASSWORD: str = env.str("TASKFORGE_REDIS_SENTINEL_PASSWORD", default="")


def _networks(name: str, default: str) -> str:
    """A comma-separated list of CIDRs from the environment; a bad entry stops start-up."""
    text: str = env.str(name, default=default)
    try:
        netblocks.parse(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None
    return text


# Where push requests may not go (queues.push.address_allowed): these networks,
# each also in its IPv4-mapped IPv6 form, unless in the allowed ones (`make run`
# allows loopback, for a target on the same machine; production never should).
TASKFORGE_PUSH_BLOCKED_NETWORKS: str = _networks(
    "TASKFORGE_PUSH_BLOCKED_NETWORKS",
    "127.0.0.0/8,::1/128,0.0.0.0/8,::/128,169.254.0.0/16,fe80::/10,224.0.0.0/4,ff00::/8",
)
TASKFORGE_PUSH_ALLOWED_NETWORKS: str = _networks("TASKFORGE_PUSH_ALLOWED_NETWORKS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_prometheus",
    "taskforge.api",
    "taskforge.audit",
    "queues",
    "tasks",
    "workers",
    "dlq",
    "dashboard",
    # Sign-in throttling (dashboard.signin); its tables come with its migrations.
    "axes",
    "cloudtasks",
]

MIDDLEWARE = [
    "taskforge.api.request_log.RequestLogMiddleware",
    # A made-up method: 405 before anything counts it or authenticates it.
    "taskforge.api.middleware.KnownMethodMiddleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "taskforge.api.middleware.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Outside the session and CSRF middleware: it sees the cookies they set.
    "taskforge.api.headers.SecurityHeadersMiddleware",
    # These five are Django's and WhiteNoise's, letting a POST to a hot endpoint (the
    # task lifecycle's, by API key) straight through: it has no use for them.
    "taskforge.api.middleware.WhiteNoiseMiddleware",
    "taskforge.api.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "taskforge.api.middleware.CsrfViewMiddleware",
    "taskforge.api.middleware.AuthenticationMiddleware",
    "taskforge.api.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # django-prometheus's, with its labelled children looked up once per process.
    "taskforge.api.middleware.PrometheusAfterMiddleware",
    # Turns a sign-in axes refused into the locked login form (AXES_LOCKOUT_CALLABLE).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "taskforge.urls"
WSGI_APPLICATION = "taskforge.wsgi.application"
APPEND_SLASH = False

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
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL")}
DATABASES["default"].setdefault("OPTIONS", {})
# Several hosts (`postgres://u@pg1:5432,pg2:5432/db`, as libpq reads them): a primary
# and its standbys.  Every connection, pooled or a loop's, goes to the one that takes
# writes (libpq tries each host and drops a session on a read-only one), so a failover
# needs no restart; a URL that says otherwise (`target_session_attrs=any`) is obeyed.
if "," in str(DATABASES["default"].get("HOST") or ""):
    DATABASES["default"]["OPTIONS"].setdefault("target_session_attrs", "read-write")
# Fail fast when Postgres is unreachable: requests answer 503 instead of hanging.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 5)
# A connection pool per process (psycopg_pool): threads of a gunicorn worker
# that sit in long polls share a few connections instead of holding one each.
DATABASE_POOL_MAX = env.int("DATABASE_POOL_MAX", default=16)
# How long a request waits for a pooled connection before it answers 503.  A
# statement holds one for milliseconds, so a wait this long means Postgres is
# gone (the pool cannot reconnect) rather than busy: answer soon, and let the
# clients' retries back off (it was 10 s: requests piled up for 10 s each).
DATABASE_POOL_TIMEOUT = 3.0
if DATABASE_POOL_MAX > 0:
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": DATABASE_POOL_MAX,
        "timeout": DATABASE_POOL_TIMEOUT,
        # No reset: a Listener sets one if it listens on a pooled connection
        # (taskforge.lib.listen).
    }
else:
    DATABASES["default"]["CONN_MAX_AGE"] = 60
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# The hot statements (taskforge.lib.pg) as named prepared statements, planned once per
# connection (a measured win: docs/operations.md). Off for a pooler in transaction mode
# that does not carry them from one server connection to the next (pgbouncer before 1.21,
# or without max_prepared_statements): they then run as unnamed statements.
DATABASE_PREPARED_STATEMENTS = env.bool("DATABASE_PREPARED_STATEMENTS", default=True)
# Where the dispatcher and the scheduler LISTEN for their wake-ups: a session of its own
# (Postgres directly, or a pooler in session mode). Unset: on their own connection to
# DATABASE_URL, which must then be a session (no transaction pooling).
DATABASE_LISTEN_URL = env.str("DATABASE_LISTEN_URL", default="")
if (
    "," in urlsplit(DATABASE_LISTEN_URL).netloc
    and "target_session_attrs" not in DATABASE_LISTEN_URL
):
    # LISTEN is refused on a standby: the same rule as DATABASE_URL's hosts.
    DATABASE_LISTEN_URL += ("&" if "?" in DATABASE_LISTEN_URL else "?") + (
        "target_session_attrs=read-write"
    )
# Django's server-side cursors (QuerySet.iterator()) live across transactions, which a
# transaction pooler cannot follow; TaskForge reads nothing big enough to need them.
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

REDIS_URL = env("REDIS_URL")
# Connections per process to REDIS_URL for the dispatch buffer (tasks.buffer).
REDIS_POOL_MAX = env.int("REDIS_POOL_MAX", default=64)
# Django's cache, in REDIS_URL's db, holds what the API processes share (the
# dashboard's queue snapshot).  Its keys read `taskforge:<version>:<key>`, apart
# from the dispatch buffer's `tf:*`.  A cache is an optimisation: when Redis
# is slow or down, a read misses and a write is dropped (logged) after at most
# half a second, and the request goes on.
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "taskforge",
        "OPTIONS": {
            "SOCKET_CONNECT_TIMEOUT": 0.5,
            "SOCKET_TIMEOUT": 0.5,
            "IGNORE_EXCEPTIONS": True,
        },
    }
}
if is_cluster(REDIS_URL):
    # django-redis speaks to one server only: on a Redis Cluster the cache is
    # TaskForge's own backend over redis-py's cluster client, with the same
    # keys, timeouts and misses-when-down (taskforge.lib.cache).
    CACHES["default"]["BACKEND"] = "taskforge.lib.cache.RedisClusterCache"
elif is_sentinel(REDIS_URL):
    # Nor does it ask Sentinels which server is the master in the URL form
    # TaskForge reads: the same backend over redisconn's Sentinel client.
    CACHES["default"]["BACKEND"] = "taskforge.lib.cache.SentinelCache"
DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
DJANGO_REDIS_LOGGER = "taskforge.cache"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Where `collectstatic` writes (the container image sets it). Unset, the
# files are served straight from the apps (WHITENOISE_USE_FINDERS).
STATIC_ROOT = env.str("STATIC_ROOT", default="") or None
# Serve static files straight from the apps (dashboard/static/) too, so a fresh
# checkout needs no collectstatic (the image still collects them at build).
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Django refuses bodies past this size before any view reads them; the
# middleware answers 413 for a declared Content-Length over it.
DATA_UPLOAD_MAX_MEMORY_SIZE = TASKFORGE_MAX_REQUEST_BYTES

SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# TLS (docs/operations.md, "Security"). X-Forwarded-Proto says whether a request
# came over HTTPS only when a proxy in front sets it: reached directly, anyone
# could send it. So it is trusted only when TASKFORGE_TRUST_PROXY says a proxy
# is in front (one that overwrites the header from its clients).
TASKFORGE_TRUST_PROXY = env.bool("TASKFORGE_TRUST_PROXY", default=False)
if TASKFORGE_TRUST_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Sent on answers to HTTPS requests only (0: never); cookies on those answers are
# Secure (taskforge.api.headers). SESSION_COOKIE_SECURE and CSRF_COOKIE_SECURE
# make them Secure on every answer, for a site that is only ever served over HTTPS.
SECURE_HSTS_SECONDS = env.int("TASKFORGE_HSTS_SECONDS", default=31_536_000)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)

# People (API.md "Security (v1.2)"): staff passwords set through the admin's forms,
# `changepassword` and `createsuperuser` pass these.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Sign-in throttling by django-axes (dashboard.signin): 5 failures per user name or 20
# per client address within the cool-off lock it out for the cool-off.  axes' backend
# comes first: it refuses a locked-out sign-in before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# The attempts live in Postgres (axes' database handler), with the rest of the truth:
# Django's cache drops writes when Redis is slow or down, which would let guesses through.
AXES_HANDLER = "dashboard.signin.SignInAttempts"
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_FAILURE_LIMIT = 1  # the handler counts limits reached, one per parameter (dashboard.signin)
AXES_COOLOFF_TIME = timedelta(minutes=15)
# A refused sign-in does not count as a failure: the lock ends 15 minutes after it began.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "taskforge.api.peer.client_address"
AXES_LOCKOUT_CALLABLE = "dashboard.signin.locked_out"
# No table of successful sign-ins, growing for ever, and no admin pages of axes' own.
AXES_DISABLE_ACCESS_LOG = True
AXES_ENABLE_ADMIN = False
AXES_VERBOSE = False

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["taskforge.api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["taskforge.api.permissions.HasRole"],
    "DEFAULT_PARSER_CLASSES": ["taskforge.api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["taskforge.api.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "taskforge.api.negotiation.ContentNegotiation",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "taskforge.api.exceptions.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DATETIME_FORMAT": "iso-8601",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "TaskForge API",
    "DESCRIPTION": (
        "Self-hosted distributed task queue. Every non-2xx answer is "
        '`{"error": {"code", "message", "fields"?}}`.'
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "TaskStatusEnum": "tasks.models.TaskStatus.choices",
        "AuditActionEnum": "taskforge.audit.models.Action.choices",
        "AuditActorKindEnum": "taskforge.audit.models.ActorKind.choices",
    },
}

# Records skip the thread and process lookups that no JSON line prints.
lean_records()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "taskforge.lib.logging.JsonFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["stderr"], "level": env("LOG_LEVEL")},
    "loggers": {
        "django.request": {"level": "ERROR"},
        "django.server": {"level": "WARNING"},
        # django-axes narrates every sign-in at INFO; its warnings (failures) stay.
        "axes": {"level": "WARNING"},
    },
}
