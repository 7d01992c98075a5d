from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    """Subscriptions, metric rules and the delivery log: an app of its own (its tables, its migrations)."""

    name = "runs.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
