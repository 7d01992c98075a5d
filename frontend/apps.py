from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"

    def ready(self) -> None:
        from frontend.ws_guard import signals_connect

        signals_connect()  # logout / user changes close that user's websockets (docs/realtime.md)
