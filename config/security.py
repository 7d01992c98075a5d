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
# API tokens (POST /api/auth/token/) expire this long after they were issued; DELETE revokes one at once.
API_TOKEN_MAX_AGE_SECONDS = env_int("API_TOKEN_MAX_AGE_SECONDS", 30 * 24 * 3600)
# Failed sign-ins (login page, token endpoint, admin) allowed per username and per client address within the
# window; past either, sign-in answers 429 until the window (counted from the first failure) ends.
AUTH_FAILURES_PER_USERNAME = env_int("AUTH_FAILURES_PER_USERNAME", 5)
AUTH_FAILURES_PER_IP = env_int("AUTH_FAILURES_PER_IP", 20)
AUTH_FAILURE_WINDOW_SECONDS = env_int("AUTH_FAILURE_WINDOW_SECONDS", 900)
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
