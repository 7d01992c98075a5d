"""Errors the run services raise; the API maps them to HTTP answers (400 naming the field, 403, 404, 409, 429)."""

from __future__ import annotations


class ServiceError(Exception):
    """Base: a request the services refuse. `field` names the input at fault, if any."""

    status_code = 400
    code: str | None = None  # a machine-readable reason, for answers a client acts on (e.g. `no_checkpoint`)

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def as_dict(self) -> dict[str, str | None]:
        body: dict[str, str | None] = {"detail": str(self), "field": self.field}
        if self.code:
            body["code"] = self.code
        return body


class InvalidInput(ServiceError):
    """Bad input (unknown origin or kind, invalid config, invalid settings)."""


class RunNotFound(ServiceError):
    status_code = 404


class InvalidTransition(ServiceError):
    """The run is not in a status that allows the operation (e.g. cancelling a finished run)."""

    status_code = 409


class NoCheckpoint(InvalidTransition):
    """Resume asked of a run with no checkpoint: 409 with code `no_checkpoint` unless the caller says
    `from_scratch` (runs/scheduling/enqueue.py run_resume)."""

    code = "no_checkpoint"


class NotAllowed(ServiceError):
    """The caller may not ask for this (e.g. a non-staff user claiming origin `schedule`)."""

    status_code = 403


class LimitExceeded(ServiceError):
    """A per-user cap is reached (e.g. `max_queued_per_user`); `field` names the cap. Answered as 429."""

    status_code = 429
