"""ASGI entry point: HTTP through Django (bodies over their cap refused first: config/body_limit.py), websockets
through Channels (session-authenticated, or by a one-use ticket for API clients: frontend/ws_ticket.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Build the Django app before importing anything that touches models (the websocket routing does).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.body_limit import BodyLimitMiddleware, daphne_body_ceiling, malloc_give_back  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402
from frontend.ws_ticket import TicketOrSession  # noqa: E402

daphne_body_ceiling()
malloc_give_back()
application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(django_asgi_app),
        # Scripts open sockets with a one-use ticket (frontend/ws_ticket.py), browsers with their session cookie.
        "websocket": TicketOrSession(
            by_ticket=URLRouter(websocket_urlpatterns),
            by_session=AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        ),
    }
)
