"""Settings for every process, read from the environment.

Embedded defaults (SQLite file, local Redis, local Ray head) need no configuration; production points
DATABASE_URL, REDIS_URL and RAY_ADDRESS at PostgreSQL, Redis and a Ray cluster. See platform/env.example.
"""
from pathlib import Path
import os

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PLATFORM_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "runs",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",  # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

# --- Database -------------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE: a writer waits for the write lock at BEGIN instead of failing mid-transaction; it is also
    # what serializes slot grants on SQLite. WAL lets readers proceed while one process writes.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"].setdefault("TEST", {})
    if os.environ.get("SQLITE_TEST_NAME"):
        DATABASES["default"]["TEST"]["NAME"] = os.environ["SQLITE_TEST_NAME"]
elif env_bool("DATABASE_POOL", False):
    # Opt-in psycopg pool for ASGI processes: a new PostgreSQL connection per request measured 15 ms p50 /
    # 42 ms p90 on the loaded 2-core box (most of an ingest post). Not for forking Celery workers.
    DATABASES["default"]["OPTIONS"] = {"pool": {"min_size": 2, "max_size": env_int("DATABASE_POOL_MAX", 16),
                                                "timeout": 10}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker and channel layer --------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

CHANNEL_LAYERS = {
    "default": {
        # The pub/sub layer: no per-channel capacity that silently drops messages (the core layer drops past
        # `capacity`), and fan-out to many consumers measured without loss on this machine kind.
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            # One subscriber connection per ASGI process whatever the client count; keepalive and a health
            # check notice a dead Redis, and redis-py resubscribes on reconnect (consumers then refill any
            # gap from the database, docs/realtime.md).
            "hosts": [{"address": REDIS_URL, "socket_keepalive": True, "health_check_interval": 5,
                       "socket_connect_timeout": 2, "retry_on_timeout": True}],
            # Pub/sub channels are global across Redis db numbers: a prefix keeps deployments (and parallel
            # test runs) sharing one Redis apart.
            "prefix": os.environ.get("CHANNEL_LAYER_PREFIX", "asgi"),
        },
    }
}
# Websockets: a run consumer idle this long compares with the database (catches events published while
# Redis was unreachable); the dashboard sends at most one update per run per this interval.
REALTIME_RESYNC_SECONDS = float(os.environ.get("REALTIME_RESYNC_SECONDS", "2"))
REALTIME_COALESCE_SECONDS = float(os.environ.get("REALTIME_COALESCE_SECONDS", "0.1"))
# Websocket limits (docs/realtime.md): open sockets per user across every ASGI process (counted in Redis;
# past it the socket is closed with 4429), events sent on connect before the client is pointed at the REST
# API for older ones, and how often an open socket re-reads its session (logout and staff changes also
# close sockets at once, by signal).
WS_MAX_PER_USER = env_int("WS_MAX_PER_USER", 20)
WS_REPLAY_MAX = env_int("WS_REPLAY_MAX", 2000)
WS_SESSION_RECHECK_SECONDS = float(os.environ.get("WS_SESSION_RECHECK_SECONDS", "15"))
# Stored events per run (runs/retention.py): high-rate types are thinned past half of it and not stored past
# it; `status` events are always stored. GET /api/runs/<id>/events/ pages are at most EVENTS_PAGE_MAX events.
EVENTS_MAX_PER_RUN = env_int("EVENTS_MAX_PER_RUN", 50_000)
EVENTS_DOWNSAMPLE_EVERY = env_int("EVENTS_DOWNSAMPLE_EVERY", 10)
EVENTS_PAGE_MAX = env_int("EVENTS_PAGE_MAX", 1000)

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# Installations (or test sessions) sharing one Redis keep their tasks apart with their own queue name.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "celery")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # How long a delivered-but-unacknowledged task stays invisible before Redis hands it to another worker:
    # the redelivery time of a task whose worker was SIGKILLed. Every task here finishes in seconds (launch,
    # stop, tick; none waits on training), and all are idempotent, so a short timeout is safe.
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 30),
    # Sweep for such tasks every 2 s (kombu's defaults, interval 10 s x throttle 10, took ~100 s here).
    "unacked_restore_interval": env_int("CELERY_UNACKED_RESTORE_INTERVAL", 2),
    "unacked_restore_throttle": 1,
}
SCHEDULER_TICK_SECONDS = float(os.environ.get("SCHEDULER_TICK_SECONDS", "2"))
CELERY_BEAT_SCHEDULE = {
    # Ticks queued while no worker was up are dropped rather than replayed in a burst.
    "runs-tick": {"task": "runs.tasks.tick", "schedule": SCHEDULER_TICK_SECONDS,
                  "options": {"expires": max(5.0, 3 * SCHEDULER_TICK_SECONDS)}},
}

# --- Ray ------------------------------------------------------------------------------------------
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
PLATFORM_PUBLIC_URL = os.environ.get("PLATFORM_PUBLIC_URL", "http://127.0.0.1:8000")
RUN_ARTIFACTS_DIR = Path(os.environ.get("RUN_ARTIFACTS_DIR", VAR_DIR / "runs"))
# Ray submission ids are `<prefix>-<run id>-<attempt>`; give each installation sharing a cluster its own prefix.
RAY_SUBMISSION_PREFIX = os.environ.get("RAY_SUBMISSION_PREFIX", "rlrun")
# Seconds a stopped job gets after SIGTERM to checkpoint before Ray SIGKILLs it.
RUN_STOP_GRACE_SECONDS = env_int("RUN_STOP_GRACE_SECONDS", 60)
# Automatic resumes (Run.auto_resume) of one run, at most.
RUN_AUTO_RESUME_MAX = env_int("RUN_AUTO_RESUME_MAX", 3)

# --- Slots ----------------------------------------------------------------------------------------
SLOTS_DEFAULT_MAX_TOTAL = env_int("SLOTS_DEFAULT_MAX_TOTAL", 4)
SLOTS_HEARTBEAT_TIMEOUT_SECONDS = env_int("SLOTS_HEARTBEAT_TIMEOUT_SECONDS", 60)
SLOTS_POLICY_CACHE_SECONDS = float(os.environ.get("SLOTS_POLICY_CACHE_SECONDS", "1"))

# --- REST API -------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "RL control plane API",
    "DESCRIPTION": "Submit reinforcement-learning training runs, watch slots and queues, tune concurrency.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Every protected operation documents its 401/403 answers (runs/api/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "runs.api.schema.add_pre_view_responses"],
}

# --- Auth, i18n, static ---------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = []
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# WhiteNoise serves the built dashboard assets (frontend/static/dist, made by `make frontend`) straight from the
# app folders, so the embedded default needs no collectstatic; production may still collectstatic to STATIC_ROOT.
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Content-Security-Policy (django-csp): no inline or foreign script, so a missed escape cannot run code.
# Style attributes stay allowed (style-src-attr): the pages and their scripts size bars and cells with them;
# <style> elements and foreign stylesheets are not (style-src-elem 'self'). 'self' covers same-host ws/wss.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "style-src-elem": ["'self'"],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
