"""Errors the run services raise; the API maps them to HTTP answers (400 naming the field, 404, 409)."""
from __future__ import annotations


class ServiceError(Exception):
    """Base: a request the services refuse. `field` names the input at fault, if any."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def as_dict(self) -> dict[str, str | None]:
        return {"detail": str(self), "field": self.field}


class InvalidInput(ServiceError):
    """Bad input (unknown origin or kind, invalid config, invalid settings)."""


class RunNotFound(ServiceError):
    status_code = 404


class InvalidTransition(ServiceError):
    """The run is not in a status that allows the operation (e.g. cancelling a finished run)."""

    status_code = 409
