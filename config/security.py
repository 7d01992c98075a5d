"""Security settings: HTTPS, trusted proxies, sign-in limits and API tokens, password rules, Content-Security-Policy.

Imported by config/settings.py (the settings module every process names); docs/operations.md, "Security
settings", describes them and platform/env.example gives their production values. The secret key and DEBUG stay
in config/settings.py, the check on the key in config/env.py.
"""

from config.env import env_bool, env_int

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

# --- Sign-in and API tokens (docs/api.md) -------------------------------------------------------------
# API tokens (POST /api/auth/token/, django-rest-knox: stored as SHA-512 digests) expire this long after they were
# issued; DELETE revokes one at once. A user holds at most API_TOKENS_PER_USER (the oldest go first).
API_TOKEN_MAX_AGE_SECONDS = env_int("API_TOKEN_MAX_AGE_SECONDS", 30 * 24 * 3600)
API_TOKENS_PER_USER = env_int("API_TOKENS_PER_USER", 10)
# Sign-in limits (runs/auth/auth_limit.py, django-axes; docs/security.md): failures are counted per (username, client
# address) and per client address, never per username alone. Past either limit that pair or address waits
# AUTH_BACKOFF_SECONDS after its last failure, doubled for each further failure, at most AUTH_BACKOFF_MAX_SECONDS
# (also how long counts are kept); while it waits, sign-in answers 429 with Retry-After.
AUTH_FAILURES_PER_USER_ADDRESS = env_int("AUTH_FAILURES_PER_USER_ADDRESS", 5)
AUTH_FAILURES_PER_IP = env_int("AUTH_FAILURES_PER_IP", 20)
AUTH_BACKOFF_SECONDS = env_int("AUTH_BACKOFF_SECONDS", 30)
AUTH_BACKOFF_MAX_SECONDS = env_int("AUTH_BACKOFF_MAX_SECONDS", 24 * 3600)
# django-axes, read from the installed source (axes/conf.py): its cache handler, subclassed for a limit per
# parameter and the exponential wait; the address through the trusted-proxy rule above; refused tries uncounted.
AXES_HANDLER = "runs.auth.auth_limit.SignInHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]  # limits in this order: runs.auth.auth_limit
AXES_FAILURE_LIMIT = AUTH_FAILURES_PER_USER_ADDRESS  # only logged: SignInHandler decides
AXES_LOCK_OUT_AT_FAILURE = False  # the failure that reaches a limit still answers "wrong password"; the next, 429
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = False  # SignInHandler clears the pair only
AXES_COOLOFF_TIME = "runs.auth.auth_limit.signin_memory"
AXES_CLIENT_IP_CALLABLE = "runs.auth.auth_limit.client_ip"
AXES_USERNAME_CALLABLE = "runs.auth.auth_limit.signin_username"
AXES_LOCKOUT_CALLABLE = "runs.auth.auth_limit.lockout_response"
AXES_ENABLE_ADMIN = False  # its admin pages list the database handler's rows; the cache handler writes none
AXES_VERBOSE = False  # no start-up banner in every process (`make run` stays quiet); failures still log, masked
# Django's four validators, at least 12 characters: createsuperuser, changepassword and the admin's forms.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- Content-Security-Policy (django-csp's middleware, listed in config/settings.py's MIDDLEWARE) -------------
# No inline or foreign script, so a missed escape cannot run code.
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
