"""What the platform keeps on Redis, read from the environment: the channel layer (real-time fan-out), Celery's
broker, queue and beat schedule (the tick), and the cache behind the sign-in failure counters. config/settings.py
imports each name; REDIS_URL names the server for all three.
"""

import os

from config.env import env_bool, env_int
from config.knobs import SCHEDULER_TICK_SECONDS

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
CELERY_BEAT_SCHEDULE = {
    # The tick every SCHEDULER_TICK_SECONDS (config/knobs.py).
    # Ticks queued while no worker was up are dropped rather than replayed in a burst.
    "runs-tick": {
        "task": "runs.tasks.tick",
        "schedule": SCHEDULER_TICK_SECONDS,
        "options": {"expires": max(5.0, 3 * SCHEDULER_TICK_SECONDS)},
    },
}

# --- Cache: sign-in failure counters (runs/auth/auth_limit.py, django-axes) ------------------------------------------
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
