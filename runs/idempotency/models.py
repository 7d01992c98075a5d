"""One row per (user, operation, Idempotency-Key) the API acted on in the last 24 hours (runs/idempotency/keys.py
writes it in the transaction of the act itself, so a key is recorded exactly when its act committed)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class IdempotencyKey(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # The operation the key was used for: "runs_create", or "runs_cancel:<id>" / "runs_resume:<id>".
    scope = models.CharField(max_length=64)
    key = models.CharField(max_length=200)
    body_sha256 = models.CharField(max_length=64)  # of the request body as canonical JSON
    run_id = models.BigIntegerField()  # the run the act created or acted on (no foreign key: a run may be deleted)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "scope", "key"], name="idempotency_key_once")]
        indexes = [models.Index(fields=["owner", "created_at"], name="idempotency_owner_age_idx")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key!r} -> run {self.run_id}"
