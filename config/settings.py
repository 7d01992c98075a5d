"""Settings for every process, read from the environment.

Embedded defaults (SQLite file, local Redis, local Ray head) need no configuration; production points
DATABASE_URL, REDIS_URL and RAY_ADDRESS at PostgreSQL, Redis and a Ray cluster. See platform/env.example.
"""

import os
from pathlib import Path

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


INSECURE_DEFAULT_SECRET_KEY = "dev-only-insecure-key-change-me"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", INSECURE_DEFAULT_SECRET_KEY)
# Earlier keys, still accepted for signatures (sessions, ingest tokens) while a rotation settles.
SECRET_KEY_FALLBACKS = [k for k in os.environ.get("DJANGO_SECRET_KEY_FALLBACKS", "").split(",") if k]
DEBUG = env_bool("DJANGO_DEBUG", False)


def secret_key_problem(key: str) -> str | None:
    """Why `key` is unfit to sign sessions and ingest tokens (Django's own check W009 criteria), or None."""
    if not key or key == INSECURE_DEFAULT_SECRET_KEY or key.startswith("django-insecure-"):
        return "it is unset or the built-in development default"
    if len(key) < 50 or len(set(key)) < 5:
        return "it is shorter than 50 characters or has fewer than 5 distinct characters"
    return None


if not DEBUG and secret_key_problem(SECRET_KEY):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY is insecure: {secret_key_problem(SECRET_KEY)}. With DJANGO_DEBUG off, set it to a long "
        "random string, e.g. the output of `python -c 'import secrets; print(secrets.token_urlsafe(50))'` "
        "(`make run` generates one under var/)."
    )
ALLOWED_HOSTS = [
    h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h
]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# --- HTTPS (docs/operations.md): off for the embedded http://127.0.0.1 default, on in platform/env.example ---
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips it from clients): trust it.
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False) else None
)
# Proxies in front of the web server that append to X-Forwarded-For: the client address for sign-in limits is
# the one this many hops from the right; 0 uses the socket's peer address (a client cannot pick its own).
NUM_PROXIES = env_int("DJANGO_NUM_PROXIES", 0)

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
    DATABASES["default"]["OPTIONS"] = {
        "pool": {"min_size": 2, "max_size": env_int("DATABASE_POOL_MAX", 16), "timeout": 10}
    }
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
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_keepalive": True,
                    "health_check_interval": 5,
                    "socket_connect_timeout": 2,
                    "retry_on_timeout": True,
                }
            ],
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
# Captured samples (runs/samples.py): a run keeps its config's `samples_keep` newest samples, at most
# SAMPLES_MAX_PER_RUN; GET /api/runs/<id>/samples/ pages are at most SAMPLES_PAGE_MAX rows.
SAMPLES_MAX_PER_RUN = env_int("SAMPLES_MAX_PER_RUN", 200_000)
SAMPLES_PAGE_MAX = env_int("SAMPLES_PAGE_MAX", 200)

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
    "runs-tick": {
        "task": "runs.tasks.tick",
        "schedule": SCHEDULER_TICK_SECONDS,
        "options": {"expires": max(5.0, 3 * SCHEDULER_TICK_SECONDS)},
    },
}

# --- Ray ------------------------------------------------------------------------------------------
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
PLATFORM_PUBLIC_URL = os.environ.get("PLATFORM_PUBLIC_URL", "http://127.0.0.1:8000")
RUN_ARTIFACTS_DIR = Path(os.environ.get("RUN_ARTIFACTS_DIR", VAR_DIR / "runs"))
# Ray submission ids are `<prefix>-<run id>-<attempt>`; give each installation sharing a cluster its own prefix.
RAY_SUBMISSION_PREFIX = os.environ.get("RAY_SUBMISSION_PREFIX", "rlrun")
# Seconds a stopped job gets after SIGTERM to checkpoint before Ray SIGKILLs it.
RUN_STOP_GRACE_SECONDS = env_int("RUN_STOP_GRACE_SECONDS", 60)
# A granted run not `running` this long after its grant fails "launch timeout ..." (Ray reachable only).
RUN_LAUNCH_TIMEOUT_SECONDS = env_int("RUN_LAUNCH_TIMEOUT_SECONDS", 900)
# A `starting` run whose job never posted anything by its placement_timeout_s plus this is put back in the queue.
RUN_PLACEMENT_MARGIN_SECONDS = env_int("RUN_PLACEMENT_MARGIN_SECONDS", 60)
# A node row dead and no longer listed by Ray this long is deleted (never while a held slot is placed on it).
CLUSTER_DEAD_NODE_RETENTION_SECONDS = env_int("CLUSTER_DEAD_NODE_RETENTION_SECONDS", 3600)
# Automatic resumes (Run.auto_resume) of one run, at most.
RUN_AUTO_RESUME_MAX = env_int("RUN_AUTO_RESUME_MAX", 3)

# --- Slots ----------------------------------------------------------------------------------------
SLOTS_DEFAULT_MAX_TOTAL = env_int("SLOTS_DEFAULT_MAX_TOTAL", 4)
# The interactive reserve when staff set none (unset: max(1, max_total // 4)); `make run` sets 0 on a machine
# that fits fewer than 4 runs, where a reserved slot would idle half of it for API runs.
SLOTS_DEFAULT_INTERACTIVE_RESERVE: int | None = (
    None
    if os.environ.get("SLOTS_DEFAULT_INTERACTIVE_RESERVE", "") == ""
    else env_int("SLOTS_DEFAULT_INTERACTIVE_RESERVE", 0)
)
SLOTS_HEARTBEAT_TIMEOUT_SECONDS = env_int("SLOTS_HEARTBEAT_TIMEOUT_SECONDS", 60)
# A running run whose heartbeat is stale while Ray still reports its job running is failed only after this long.
SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS = env_int("SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS", 600)
SLOTS_POLICY_CACHE_SECONDS = float(os.environ.get("SLOTS_POLICY_CACHE_SECONDS", "1"))

# --- Cache: sign-in failure counters (runs/auth_limit.py) -------------------------------------------
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("CACHE_KEY_PREFIX", "rlcp"),
    }
    if os.environ.get("REDIS_URL")
    # One process only: counters are per process (tests and single-process tools).
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

# --- Prometheus metrics (docs/observability.md) ------------------------------------------------------
# GET /metrics answers staff sessions, and `Authorization: Bearer <METRICS_TOKEN>` when a token is set;
# METRICS_PUBLIC opens it to anyone (default: only with DJANGO_DEBUG). `manage.py metrics_serve` serves the
# same metrics without authentication on METRICS_ADDR:METRICS_PORT (a separate port for a private network).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", DEBUG)
METRICS_ADDR = os.environ.get("METRICS_ADDR", "127.0.0.1")
METRICS_PORT = env_int("METRICS_PORT", 9464)
# Redis hash prefix of the recorded counters and histograms (runs/metrics/record.py).
METRICS_REDIS_PREFIX = os.environ.get("METRICS_REDIS_PREFIX", "rlcp:metrics")

# --- REST API -------------------------------------------------------------------------------------
# API tokens (POST /api/auth/token/) expire this long after they were issued; DELETE revokes one at once.
API_TOKEN_MAX_AGE_SECONDS = env_int("API_TOKEN_MAX_AGE_SECONDS", 30 * 24 * 3600)
# Failed sign-ins (login page, token endpoint, admin) allowed per username and per client address within the
# window; past either, sign-in answers 429 until the window (counted from the first failure) ends.
AUTH_FAILURES_PER_USERNAME = env_int("AUTH_FAILURES_PER_USERNAME", 5)
AUTH_FAILURES_PER_IP = env_int("AUTH_FAILURES_PER_IP", 20)
AUTH_FAILURE_WINDOW_SECONDS = env_int("AUTH_FAILURE_WINDOW_SECONDS", 900)
AUTHENTICATION_BACKENDS = ["runs.auth_limit.LimitedModelBackend"]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "runs.api.tokens.ExpiringTokenAuthentication",
    ],
    # JSON only, with a nesting limit and no lone surrogates / NUL (runs/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["runs.api.parsers.SafeJSONParser"],
    "NUM_PROXIES": NUM_PROXIES,
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
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.api.schema.add_pre_view_responses",
    ],
}

# --- Auth, i18n, static ---------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
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
