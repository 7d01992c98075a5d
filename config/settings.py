"""Settings for every process, read from the environment: the module DJANGO_SETTINGS_MODULE names everywhere.

Embedded defaults (SQLite file, local Redis, local Ray head) need no configuration; production points
DATABASE_URL, REDIS_URL and RAY_ADDRESS at PostgreSQL, Redis and a Ray cluster. See platform/env.example.

This module holds Django's wiring (apps, middleware, database, REST API, logging) and imports the rest by name:
what lives on Redis (channel layer, Celery, cache) from config/redis_services.py, the security settings from
config/security.py, the control plane's own knobs (realtime, events, Ray, slots, metrics) from config/knobs.py;
config/env.py reads the variables.
"""

import os

import dj_database_url

from config.env import (
    BASE_DIR,
    INSECURE_DEFAULT_SECRET_KEY,
    VAR_DIR,
    env_bool,
    env_debug,
    env_int,
    env_list,
    env_throttle_rate,
    refuse_insecure_secret_key,
    refuse_placeholder_metrics_token,
)
from config.knobs import (
    AGENT_ENVIRONMENTS_ALLOWED,
    AGENT_PROXY_CONNECT_TIMEOUT_SECONDS,
    AGENT_PROXY_MAX_ANSWER_BYTES,
    AGENT_PROXY_READ_TIMEOUT_SECONDS,
    CLUSTER_DEAD_NODE_RETENTION_SECONDS,
    EVENTS_DOWNSAMPLE_EVERY,
    EVENTS_MAX_PER_RUN,
    EVENTS_PAGE_MAX,
    INGEST_EVENT_MAX_BYTES,
    METRICS_ADDR,
    METRICS_PORT,
    METRICS_PUBLIC,
    METRICS_REDIS_PREFIX,
    METRICS_TOKEN,
    PLATFORM_PUBLIC_URL,
    RAY_ADDRESS,
    RAY_SUBMISSION_PREFIX,
    REALTIME_COALESCE_SECONDS,
    REALTIME_RESYNC_SECONDS,
    RUN_ARTIFACTS_DIR,
    RUN_AUTO_RESUME_MAX,
    RUN_LAUNCH_TIMEOUT_SECONDS,
    RUN_PLACEMENT_MARGIN_SECONDS,
    RUN_STOP_GRACE_SECONDS,
    SAMPLES_MAX_PER_RUN,
    SAMPLES_PAGE_MAX,
    SCHEDULER_TICK_SECONDS,
    SLOTS_DEFAULT_INTERACTIVE_RESERVE,
    SLOTS_DEFAULT_MAX_TOTAL,
    SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS,
    SLOTS_HEARTBEAT_TIMEOUT_SECONDS,
    SLOTS_POLICY_CACHE_SECONDS,
    WS_MAX_PER_USER,
    WS_REPLAY_MAX,
    WS_SESSION_RECHECK_SECONDS,
)
from config.limits import (
    AGENT_PROXY_MAX_BODY_BYTES,
    ANON_MAX_BODY_BYTES,
    BODY_LIMITS,
    DATA_UPLOAD_MAX_MEMORY_SIZE,
    INGEST_MAX_BODY_BYTES,
    JSON_MAX_ITEMS,
    JSON_MAX_KEY_CHARS,
    JSON_MAX_NODES,
    JSON_MAX_STRING_CHARS,
    MAX_BODY_BYTES,
    WS_MAX_MESSAGE_BYTES,
)
from config.redis_services import (  # Redis: channel layer, Celery, cache
    CACHES,
    CELERY_BEAT_SCHEDULE,
    CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP,
    CELERY_BROKER_TRANSPORT_OPTIONS,
    CELERY_BROKER_URL,
    CELERY_RESULT_BACKEND,
    CELERY_TASK_ACKS_LATE,
    CELERY_TASK_ALWAYS_EAGER,
    CELERY_TASK_DEFAULT_QUEUE,
    CELERY_TASK_IGNORE_RESULT,
    CELERY_TASK_REJECT_ON_WORKER_LOST,
    CELERY_WORKER_PREFETCH_MULTIPLIER,
    CHANNEL_LAYERS,
    REDIS_URL,
)
from config.security import (  # AXES_*: django-axes, for runs/auth/auth_limit.py
    API_TOKEN_MAX_AGE_SECONDS,
    API_TOKENS_PER_USER,
    AUTH_BACKOFF_MAX_SECONDS,
    AUTH_BACKOFF_SECONDS,
    AUTH_FAILURES_PER_IP,
    AUTH_FAILURES_PER_USER_ADDRESS,
    AUTH_PASSWORD_VALIDATORS,
    AXES_CLIENT_IP_CALLABLE,
    AXES_COOLOFF_TIME,
    AXES_ENABLE_ADMIN,
    AXES_FAILURE_LIMIT,
    AXES_HANDLER,
    AXES_LOCK_OUT_AT_FAILURE,
    AXES_LOCKOUT_CALLABLE,
    AXES_LOCKOUT_PARAMETERS,
    AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT,
    AXES_RESET_ON_SUCCESS,
    AXES_USERNAME_CALLABLE,
    AXES_VERBOSE,
    CONTENT_SECURITY_POLICY,
    CSRF_COOKIE_SECURE,
    NUM_PROXIES,
    SECURE_HSTS_INCLUDE_SUBDOMAINS,
    SECURE_HSTS_PRELOAD,
    SECURE_HSTS_SECONDS,
    SECURE_PROXY_SSL_HEADER,
    SECURE_SSL_REDIRECT,
    SESSION_COOKIE_SECURE,
)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", INSECURE_DEFAULT_SECRET_KEY)
# Earlier keys, still accepted for signatures (sessions, ingest tokens) while a rotation settles.
SECRET_KEY_FALLBACKS = env_list("DJANGO_SECRET_KEY_FALLBACKS", "")
DEBUG = env_debug()
refuse_insecure_secret_key(SECRET_KEY, DEBUG)
refuse_placeholder_metrics_token(METRICS_TOKEN)
# No `testserver` here: Django's test runner (pytest-django too) adds it for the test client, and only there.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",  # API tokens, hashed at rest (runs/api/tokens.py)
    "axes",  # sign-in limits (runs/auth/auth_limit.py)
    "drf_spectacular",
    "channels",
    "runs",
    "runs.outbox",  # after-commit effects of the run lifecycle (runs/outbox/)
    "runs.idempotency",  # Idempotency-Key: a retried submit, cancel or resume acts once (runs/idempotency/)
    "runs.audit",  # append-only log of who changed what, written with each change (runs/audit/)
    "runs.webhooks",  # signed webhooks and metric alerts (runs/webhooks/, docs/api.md "Webhooks")
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "runs.audit.request_id.RequestIdMiddleware",  # X-Request-ID in, out, and on audit rows
    "csp.middleware.CSPMiddleware",  # Content-Security-Policy on every response (config/security.py)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last (axes' docs): a sign-in its backend refused answers 429
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
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend plus one rule: a transaction that took the grant lock and rolls back still catches up.
    DATABASES["default"]["ENGINE"] = "runs.slots.pgengine"
    if env_bool("DATABASE_POOL", False):
        # Opt-in psycopg pool for ASGI processes: a new PostgreSQL connection per request measured 15 ms p50 /
        # 42 ms p90 on the loaded 2-core box (most of an ingest post). Not for forking Celery workers.
        DATABASES["default"]["OPTIONS"] = {
            "pool": {"min_size": 2, "max_size": env_int("DATABASE_POOL_MAX", 16), "timeout": 10}
        }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- REST API -------------------------------------------------------------------------------------
# Sign-in (pages, token endpoint, admin): axes' backend first refuses while blocked (limits in config/security.py).
AUTHENTICATION_BACKENDS = ["runs.auth.auth_limit.SignInBackend", "django.contrib.auth.backends.ModelBackend"]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "runs.api.tokens.HashedTokenAuthentication",
    ],
    # JSON only, with a nesting limit and no lone surrogates / NUL (runs/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["runs.api.parsers.SafeJSONParser"],
    "NUM_PROXIES": NUM_PROXIES,
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# django-rest-knox: 64 hex characters of which only a SHA-512 digest (and the first 15, to find the row) is stored;
# expiry is set from API_TOKEN_MAX_AGE_SECONDS at issue (runs/auth/tokens.py), and `Token` stays the header's word.
REST_KNOX = {"AUTH_HEADER_PREFIX": "Token", "AUTO_REFRESH": False}
# Per-user rates of the heavy reads (runs/api/throttles.py, which holds the defaults): THROTTLE_RATE_TRACE,
# THROTTLE_RATE_COMPARE, THROTTLE_RATE_DRY_RUN, THROTTLE_RATE_SAMPLES, THROTTLE_RATE_AGENTS (requests through the
# proxy to runs' session servers), THROTTLE_RATE_WS_TICKET (websocket tickets), THROTTLE_RATE_WEBHOOKS (the
# webhook API), THROTTLE_RATE_PRIORITY (a run's priority factors), each "<requests>/<sec|min|hour|day>".
HEAVY_READ_THROTTLE_RATES = {
    scope: rate
    for scope in ("trace", "compare", "dry_run", "samples", "agents", "ws_ticket", "webhooks", "priority")
    if (rate := env_throttle_rate(f"THROTTLE_RATE_{scope.upper()}"))
}
# Webhooks (runs/webhooks/): private/loopback targets only when staff allow them here (or per subscription), the
# deliveries' attempts (retried after 1, 2, 4 ... s, capped), and how many subscriptions a user may hold.
WEBHOOKS_ALLOW_PRIVATE_TARGETS = env_bool("WEBHOOKS_ALLOW_PRIVATE_TARGETS", False)
WEBHOOKS_MAX_ATTEMPTS = env_int("WEBHOOKS_MAX_ATTEMPTS", 10)
WEBHOOKS_RETRY_BASE_MS = env_int("WEBHOOKS_RETRY_BASE_MS", 1000)
WEBHOOKS_RETRY_MAX_S = env_int("WEBHOOKS_RETRY_MAX_S", 600)
WEBHOOKS_MAX_PER_USER = env_int("WEBHOOKS_MAX_PER_USER", 20)
SPECTACULAR_SETTINGS = {
    "TITLE": "RL control plane API",
    "DESCRIPTION": "Submit reinforcement-learning training runs, watch slots and queues, tune concurrency.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Every protected operation documents its 401/403 answers (runs/api/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.api.schema.add_pre_view_responses",
    ],
}

# --- Login, i18n, static ---------------------------------------------------------------------------
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

# --- Logging --------------------------------------------------------------------------------------
# Loggers that speak on every tick or at every start, not when something happens: Celery beat's "Sending due
# task", the worker's "Task ... received/succeeded" and its start-up lines, daphne's start-up lines. Their level
# is LOG_LEVEL_CHATTER (INFO unless set; `make run` sets WARNING unless --verbose); their warnings and errors
# still show. What a tick did is logged by runs.tasks, at INFO.
CHATTER_LOGGERS = (
    "celery.beat",
    "celery.worker.strategy",
    "celery.app.trace",
    "celery.worker.consumer",
    "celery.apps.worker",
    "daphne",
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {name: {"level": os.environ.get("LOG_LEVEL_CHATTER", "INFO")} for name in CHATTER_LOGGERS},
}
