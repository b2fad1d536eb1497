"""Strata's errors: one base for every failure a client is told about, and the rule for everything else.

Role: `StrataError` is the one base of a refusal a client gets as an answer: a `status` (400 bad input, 401,
403, 404, 408, 409, 413, 415, 503 busy or loading, 502, 507 ...), a dialect-neutral `message` that says what to
change, and optionally the `param` it names, a `code` and `extra` keys (llama-server's figures). Bad input is
`serve.core.events.BadRequest`; the HTTP shell's refusals `serve.http.guard.HttpError`; the lifecycle's
`LifecycleError`; a full disk `strata_control.files.StorageFull`; what the Service cannot answer now
`ServiceError` here (engine exceptions and death notes are turned into these once, at the Service boundary:
`Service.service_error`). The one HTTP boundary (serve/http/server.py, and a stream's last event after its
headers: serve/api/wire.py `error_text`) asks `client_error(e)` for the StrataError an exception is; where there
is none the exception is a bug: a 500 whose text is `bug_text(e)` ("internal error (KeyError); see the server
log"), never blamed on the client, with `log_bug(e)` writing the traceback to the server log once.

Public surface: `StrataError`, `ServiceError` (`status`, `err_type`, `message`), `ServiceUnavailable` (503:
the engine is starting, down, stuck, or the server is shutting down), `EngineFault` (502: the engine broke the
protocol); `client_error(e)`, `bug_text(e)`, `log_bug(e, where)`; `public_text(text)`: what a failure may tell
a client (without the engine log tail, local paths cut to their last part; the whole text goes to the server
log once).
"""
from __future__ import annotations

import re
import sys
import threading
import traceback

from tokenizer.base import TextError


class StrataError(Exception):
    """A request refused or not answerable, said in terms of the request (no dialect's shape): the boundary
    writes it in the caller's API's error shape. `public`: the message may hold engine log tails or local paths
    and passes `public_text` first."""
    status = 400
    err_type = "invalid_request_error"
    public = False

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int | None = None, err_type: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.extra = extra or {}
        if status is not None:
            self.status = status
        if err_type is not None:
            self.err_type = err_type

    def client_text(self) -> str:
        """The message as a client may read it."""
        return public_text(self.message) if self.public else self.message


def client_error(e: BaseException) -> StrataError | None:
    """The StrataError `e` is, or stands for, at the boundary; None: `e` is a bug (a 500)."""
    if isinstance(e, StrataError):
        return e
    if isinstance(e, TextError):   # the tokenizer (floor 0) knows no serve: text it cannot take is bad input
        return StrataError(str(e))
    if isinstance(e, RecursionError):   # a body nested deeper than a walk over it can go
        return StrataError("the request is nested too deeply")
    return None


def bug_text(e: BaseException) -> str:
    """A bug as the client sees it: its type, no detail (that is the server log's)."""
    return f"internal error ({type(e).__name__}); see the server log"


def log_bug(e: BaseException, where: str = "") -> None:
    """One entry in the server log for a bug: a line naming it and where, then its traceback."""
    lines = traceback.format_exception(type(e), e, e.__traceback__)
    head = f"strata: internal error ({type(e).__name__}: {e})" + (f" in {where}" if where else "")
    print(head + "\n" + "".join(lines).rstrip("\n"), file=sys.stderr, flush=True)


class ServiceError(StrataError, RuntimeError):
    """A request the service cannot answer now, through no fault of the client's."""
    status = 503
    err_type = "unavailable_error"
    public = True

    def __init__(self, message: str):
        super().__init__(message)


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
