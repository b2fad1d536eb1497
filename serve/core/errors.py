"""Service errors: all the HTTP layer (serve/http/server.py, the translators) ever sees of a failure below the
Service. Engine exceptions (serve/engine_client/protocol.py) and death notes are turned into these once, at the
Service boundary (`Service.service_error`); bad client input stays `serve.core.events.BadRequest`.

Public surface: `ServiceError` (`status`, `err_type`, `message`), `ServiceUnavailable` (503: the engine is
starting, down, stuck, or the server is shutting down), `EngineFault` (502: the engine broke the protocol);
`public_text(text)`: what a failure may tell a client (without the engine log tail, local paths cut to their
last part; the whole text goes to the server log once).
"""
from __future__ import annotations

import re
import sys
import threading


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


# serve/engine_client/engine.py's death notes end with "; log: line | line | ..."; the Service may join several notes and
# add "; the next request restarts it": a tail runs to the next clause about the engine, a replica, or the end
_LOG_TAIL = re.compile(r"; log: .*?(?=; (?:the |replica \d+: )|$)", re.S)


# an absolute, home or relative file path (two parts or more; the server's own routes /v1/..., /api/... are not)
_PATH = re.compile(r"(?<![\w:/.~-])(?:~|\.{1,2})?/(?!v1/|api/)(?:[^\s/;:,()'\"]+/)+([^\s/;:,()'\"]*)")


_logged_lock = threading.Lock()   # guards _logged


_logged: list[str] = []           # the last few full texts printed (so a dead engine is not printed per request)


def public_text(text: str) -> str:
    """`text` without the engine log tail and with local paths cut to their last part; the whole text is
    printed to the server log once (the operator's copy)."""
    short = _PATH.sub(lambda m: m.group(1) or "...", _LOG_TAIL.sub("", text))
    if short != text:
        with _logged_lock:
            fresh = text not in _logged
            if fresh:
                _logged.append(text)
                del _logged[:-8]
        if fresh:
            print(f"strata: {text}", file=sys.stderr, flush=True)
    return short
