"""Service errors: all the HTTP layer (serve/http/server.py, the translators) ever sees of a failure below the
Service. Engine exceptions (serve/engine_client/protocol.py) and death notes are turned into these once, at the
Service boundary (`Service.service_error`); bad client input stays `serve.core.events.BadRequest`.

Public surface: `ServiceError` (`status`, `err_type`, `message`), `ServiceUnavailable` (503: the engine is
starting, down, stuck, or the server is shutting down), `EngineFault` (502: the engine broke the protocol).
"""
from __future__ import annotations


class ServiceError(RuntimeError):
    """A request the service cannot answer now, through no fault of the client's."""
    status = 503
    err_type = "unavailable_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ServiceUnavailable(ServiceError):
    """503: the engine is starting, down or stuck, or the server is shutting down."""


class EngineFault(ServiceError):
    """502: the engine answered with a line that breaks the protocol (it was restarted)."""
    status = 502
    err_type = "engine_error"
