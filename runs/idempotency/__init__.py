"""Idempotent mutations of the REST API: a client's `Idempotency-Key` makes a retried submit, cancel or resume
act once (docs/api.md, "Retries")."""
