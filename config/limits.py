"""Size limits of what clients send: request bodies, decoded JSON, websocket messages (docs/security.md).

Imported by config/settings.py; read as django.conf.settings.<NAME> by config/body_limit.py (the ASGI app's body
cap), runs/api/parsers.py (the API's JSON parser) and frontend/ws_guard.py (websocket messages). Each keeps the
environment variable of its name.
"""

from config.env import env_int

# --- Request bodies: the body cap is applied before anything is parsed ---------------------------------------
# by the ASGI app (config/body_limit.py: 413 by Content-Length at once, else by counting the streamed bytes) and
# again by the API's JSON parser (runs/api/parsers.py); over it the answer is 413 {"detail", "limit"}.
MAX_BODY_BYTES = env_int("MAX_BODY_BYTES", 1024 * 1024)
# A job's event batches (POST /api/runs/<id>/ingest/): 1,000 gate or train events take ~250 KB, the trainer
# posts at most 200 per batch. Decoded strings take up to 4 bytes a character, so a body may cost 4x its size.
INGEST_MAX_BODY_BYTES = env_int("INGEST_MAX_BODY_BYTES", 2 * 1024 * 1024)
# A request through the proxy to a run's session server (POST /api/runs/<id>/v1/...: runs/api/proxy.py): one
# chat request with its whole conversation.
AGENT_PROXY_MAX_BODY_BYTES = env_int("AGENT_PROXY_MAX_BODY_BYTES", 256 * 1024)
# What a client that has not signed in may send: the token endpoint and the login pages.
ANON_MAX_BODY_BYTES = env_int("ANON_MAX_BODY_BYTES", 16 * 1024)
# (path regex, cap) in order; the first whose regex matches the whole path applies, else MAX_BODY_BYTES.
BODY_LIMITS: tuple[tuple[str, int], ...] = (
    (r"/api/runs/\d+/ingest/", INGEST_MAX_BODY_BYTES),
    (r"/api/runs/\d+/v1/.*", AGENT_PROXY_MAX_BODY_BYTES),
    (r"/api/auth/token/|/login/|/admin/login/", ANON_MAX_BODY_BYTES),
)
# Django's own cap on form and request.body reads: a backstop no body the caps above let in can reach.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(MAX_BODY_BYTES, INGEST_MAX_BODY_BYTES)
# Limits of a decoded JSON body, each a 400 naming the field (runs/api/parsers.py): characters of an object key
# and of a string, items of one list or object, and values in the whole body (counted before it is decoded).
JSON_MAX_KEY_CHARS = env_int("JSON_MAX_KEY_CHARS", 256)
JSON_MAX_STRING_CHARS = env_int("JSON_MAX_STRING_CHARS", 64 * 1024)
JSON_MAX_ITEMS = env_int("JSON_MAX_ITEMS", 10_000)
JSON_MAX_NODES = env_int("JSON_MAX_NODES", 50_000)
# Websocket messages from browsers (they send none today): past this the socket closes with 4413. daphne itself
# refuses messages over 1 MiB (its --websocket-max-message-size) with 1009 before the application sees them.
WS_MAX_MESSAGE_BYTES = env_int("WS_MAX_MESSAGE_BYTES", 4096)
