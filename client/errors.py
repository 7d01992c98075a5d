"""What the client raises: the API's refusals with their field and message, and an unreachable platform."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """The API refused a request: HTTP `status`, the field it names (`field`, None when none), its message
    (`detail`) and machine-readable `code` when it gives one (e.g. `no_checkpoint`, `idempotency_key_reused`)."""

    def __init__(self, status: int, body: Any) -> None:
        body = body if isinstance(body, dict) else {"detail": str(body)}
        self.status = status
        self.field: str | None = body.get("field")
        self.detail: str = str(body.get("detail", body))
        self.code: str | None = body.get("code")
        super().__init__(f"{status}: {self.detail}")


class ConnectionFailed(Exception):
    """The platform could not be reached (after the client's retries)."""
