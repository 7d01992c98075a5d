"""Signed webhooks: systems that submit runs subscribe a URL to what happens to runs (status moves, a poisoned
gate, a checkpoint written, an evaluation finished, a metric rule crossed) instead of polling. A matching event
stores a delivery row and an outbox effect in the event's own transaction (runs/webhooks/emit.py); the drainer
sends the effect to the Celery task that POSTs it, signed, retried until accepted (runs/webhooks/tasks.py).
docs/api.md, "Webhooks"."""
