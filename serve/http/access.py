"""Who may ask what: the Host, API key, Origin and browser checks, and what an error may tell a client.

Role: the HTTP server's security rules as plain functions over a request's headers, raising `HttpError`
(403, 401, 415). They know nothing of routes beyond the path sets they are given, nothing of sockets.
- Host (DNS rebinding): without an API key a request must name this server: localhost, an IP literal, the
  bound address, `allowed_hosts` / STRATA_ALLOWED_HOSTS; bound beyond loopback also the machine's own names
  and `host.docker.internal` (how a container, e.g. Open WebUI in Docker, reaches the host).
- Origin: without an API key, an opaque page (`Origin: null`, `file://`, `data:`: any page can be one) is
  refused on API routes unless `cors_origins` lists it; a cross-site POST is refused unless listed.
- CORS (`cors_allows`, `cors_headers`): closed unless `cors_origins` (`--cors`) opens it: exact origins, `*`
  (any page: llama-server's default, opt-in here) or `localhost` (pages of this machine only).
- Browser POSTs: a request that carries Origin or Sec-Fetch-* (a browser) must be `application/json`, so no
  page can send a CORS-simple `text/plain` request that skips the preflight.
- (what an engine-derived message may tell a client: `serve.core.errors.public_text`, below the translators.)

Public surface: `check_host`, `check_key`, `check_origin`, `cors_allows`, `cors_headers`, `check_browser_json`, `trusted`.
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import socket
from urllib.parse import urlsplit

from serve.http.guard import HttpError

CORS_METHODS = "GET, POST, DELETE, OPTIONS"   # every method a route answers (llama-server's default list)
CORS_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, X-Conversation-Id"


def _host_name(host: str) -> str:
    name = host[1:host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    return name.lower().rstrip(".")


@functools.lru_cache(maxsize=1)
def _own_names() -> frozenset[str]:
    """This machine's names (hostname, its FQDN, hostname.local for mDNS) and host.docker.internal."""
    names = {"host.docker.internal"}
    try:
        short = socket.gethostname().lower()
        names.update({short, short + ".local", socket.getfqdn().lower()})
    except OSError:
        pass
    return frozenset(n.rstrip(".") for n in names if n)


def check_host(headers, bound_host: str, allowed_hosts, has_keys: bool) -> None:
    if has_keys or not headers.get("Host"):
        return
    host = headers["Host"]
    name = _host_name(host)
    allowed = [a.strip().lower() for a in list(allowed_hosts) + os.environ.get("STRATA_ALLOWED_HOSTS", "").split(",")
               if a.strip()]
    bound = bound_host.lower()
    if "*" in allowed or name in ("localhost", bound) or name.endswith(".localhost"):
        return
    try:
        ipaddress.ip_address(name)
        return
    except ValueError:
        pass
    if not _loopback(bound) and name in _own_names():
        return
    for a in allowed:
        if name == a or (a.startswith(".") and (name.endswith(a) or name == a[1:])):
            return
    raise HttpError(403, "forbidden", f"the Host {host!r} is not one this server answers to "
                    "(DNS-rebinding protection); add it to allowed_hosts or STRATA_ALLOWED_HOSTS")


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def check_key(headers, keys) -> bool:
    """Raises 401 unless the request carries one of `keys`; True when it did (False: no keys to check)."""
    if not keys:
        return False
    got = headers.get("X-Api-Key") or ""
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        got = auth[7:].strip()
    ok = False
    for k in keys:  # constant-time compare against every key
        ok |= hmac.compare_digest(got.encode("utf-8", "surrogateescape"), k.encode("utf-8"))
    if not ok:
        raise HttpError(401, "authentication_error", "missing or wrong API key")
    return True


def _local_origin(origin: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in ("localhost", "127.0.0.1", "::1")


def cors_allows(origin: str | None, cors_origins) -> bool:
    """Whether `cors_origins` (--cors / the config's list) opens the API to the page `origin`: listed exactly,
    `*` (any page), or `localhost` (a page served from this machine: localhost, 127.0.0.1, [::1], any port)."""
    if not origin:
        return False
    return "*" in cors_origins or origin in cors_origins or ("localhost" in cors_origins and _local_origin(origin))


def cors_headers(headers, cors_origins, preflight: bool) -> dict:
    """The CORS answer headers for an allowed page, else {} (a closed server says nothing, and the browser
    refuses). The Origin is echoed, never `*`, with credentials allowed, as llama-server answers by default
    (Strata reads no cookies: a key travels in a header the page sets). A preflight allows the methods of
    every route and the headers the page asked for: `*` would not cover Authorization (Fetch standard)."""
    origin = headers.get("Origin")
    if not cors_allows(origin, cors_origins):
        return {}
    out = {"Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Allow-Credentials": "true"}
    if preflight:
        out.update({"Access-Control-Allow-Methods": CORS_METHODS, "Access-Control-Max-Age": "600",
                    "Access-Control-Allow-Headers": headers.get("Access-Control-Request-Headers") or CORS_HEADERS})
    return out


def check_origin(headers, method: str, cors_origins, has_keys: bool) -> None:
    """For API routes (the caller skips pages and /health)."""
    origin = headers.get("Origin")
    if not origin or has_keys or cors_allows(origin, cors_origins):
        return
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https"):  # null (sandboxed frames, file://, data:, redirects) and the like
        raise HttpError(403, "forbidden", f"requests from a page with Origin {origin!r} (a local file, data: "
                        "URL or sandboxed frame) are not allowed without an API key; add it to cors_origins")
    if method == "POST" and parts.netloc != (headers.get("Host") or ""):
        raise HttpError(403, "forbidden", f"requests from the page {origin!r} are not allowed; add it to "
                        "cors_origins")


def check_browser_json(headers) -> None:
    """A browser's POST must be application/json (a preflighted type); other clients are not asked."""
    if not (headers.get("Origin") or headers.get("Sec-Fetch-Site") or headers.get("Sec-Fetch-Mode")):
        return
    ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise HttpError(415, "invalid_request_error", "a browser must send this request as Content-Type: "
                        f"application/json (got {ctype or 'none'!r})")


def trusted(keys, key_checked: bool, peer_ip: str) -> bool:
    """Whether a client may see local detail (engine log lines, paths): it gave a key, or the server has
    none and the client is on this machine."""
    return key_checked if keys else _loopback(peer_ip)

