"""Django project configuration. The Celery app is exposed here so `celery -A config` finds it."""

from .celery_app import app as celery_app

__all__ = ("celery_app",)
