"""The server's options from command-line flags over the run config: the run config itself, flags checked before
anything loads, listening and security options (API keys, CORS, allowed hosts, host name), the saved-slot
folder, the stored Responses' bounds, stream pacing, and binding the socket. Flags win over the config, the
config over defaults. Knows nothing of the engine or the Service.

Public surface: `load_config(ns)`, `check_flags(ns)`, `options(ns, cfg) -> Options`, `host_name(value)`,
`slot_save_path(ns, cfg)`, `stream_interval_ms(ns, cfg)`, `bind(opts)`, `CTX_FLAG_MAX`.
"""
from __future__ import annotations

import os
import re
import sys

from serve.bootstrap.paths import SetupError, default_model_path, private_dir
from serve.http import guard as http_guard
from serve.http.server import Options

CTX_FLAG_MAX = 1 << 20      # no GGUF model here trains on more than a million positions


def _names(cfg, key) -> list[str]:
    """A config list of names (`cors_origins`, `allowed_hosts`); one string is a list of one."""
    value = cfg.get(key) or []
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise SetupError(f'config: "{key}" must be a list of non-empty strings, e.g. ["https://app.example"]')
    return [v.strip() for v in value]


def _flag_names(ns, flag) -> list[str]:
    """A repeatable, comma-separated flag (--cors) -> its names."""
    return [v.strip() for arg in getattr(ns, flag, None) or [] for v in arg.split(",") if v.strip()]


def load_config(ns) -> dict:
    """The run config: `--config FILE`, else the model's own `strata-<model>.json` (beside the model file or
    in ~/.config/strata) when there is one. Notices (unknown keys by name, mended mistakes) are printed."""
    from strata_control import runconfig
    path = getattr(ns, "config", None)
    model = getattr(ns, "model", None) or (None if getattr(ns, "tokenizer", None) == "bytes"
                                            else default_model_path())
    if not path and model:
        from strata_control.runconfig_file import default_model_name
        path = runconfig.find_run_config(model, default_model_name(model))
        if path:
            print(f"strata: run config {path}", file=sys.stderr)
    if not path:
        return {}
    cfg, notices = runconfig.load(path)
    for n in notices:
        print(f"strata: {n}", file=sys.stderr)
    return cfg


def check_flags(ns) -> None:
    """What is wrong whatever the model, said in one line before anything loads (SetupError; exit 2)."""
    port, threads, ctx = getattr(ns, "port", None), getattr(ns, "threads", None), getattr(ns, "ctx", None)
    replicas = getattr(ns, "replicas", None)
    if port is not None and not 0 <= port <= 65535:
        raise SetupError(f"--port {port}: ports are 0..65535 (0 = a free one)")
    cores = os.cpu_count() or 1
    if threads is not None and not 1 <= threads <= cores:
        raise SetupError(f"--threads {threads}: this machine has {cores} CPUs; use 1..{cores}")
    if ctx is not None and not 1 <= ctx <= CTX_FLAG_MAX:
        raise SetupError(f"--ctx {ctx}: a context is 1..{CTX_FLAG_MAX} tokens (and at most the model's)")
    if replicas is not None and replicas < 1:
        raise SetupError(f"--replicas {replicas}: at least 1")
    max_loaded, budget = getattr(ns, "max_loaded", None), getattr(ns, "models_ram_budget", None)
    if max_loaded is not None and not 1 <= max_loaded <= 64:
        raise SetupError(f"--max-loaded {max_loaded}: 1..64 models at once")
    if budget is not None and not budget > 0:
        raise SetupError(f"--models-ram-budget {budget}: a size in GB above 0, e.g. 8")


def options(ns, cfg: dict) -> Options:
    """The listening and security options from the flags over the run config."""
    pick = lambda name, default=None: getattr(ns, name, None) if getattr(ns, name, None) is not None \
        else cfg.get(name, default)
    opts = Options(host=pick("host", "127.0.0.1"), port=int(pick("port", 8080)),
                   api_keys=_keys(ns, cfg), cors_origins=_names(cfg, "cors_origins") + _flag_names(ns, "cors"),
                   allowed_hosts=_names(cfg, "allowed_hosts"),
                   parent_pid=getattr(ns, "parent_pid", None), quiet=bool(getattr(ns, "quiet", False)),
                   stream_interval_ms=stream_interval_ms(ns, cfg), slot_save_path=slot_save_path(ns, cfg),
                   host_name=host_name(pick("host_name", os.environ.get("STRATA_HOST_NAME"))),
                   **_responses_options(ns, cfg))
    if "*" in opts.cors_origins and not opts.api_keys:
        print("strata: security: CORS is open to every origin and there is no API key: any web page this "
              "machine's browser opens can use the server (add --api-key, or name the origins)", file=sys.stderr)
    return opts


HOST_NAME_CHARS = re.compile(r"[A-Za-z0-9._:-]{1,64}")   # a header value that needs no quoting, any log reads


def host_name(value: str | None) -> str | None:
    """--host-name / host_name / $STRATA_HOST_NAME: this host's name in a cluster, sent as X-Strata-Host."""
    if value is None:
        return None
    if not isinstance(value, str) or not HOST_NAME_CHARS.fullmatch(value):
        raise SetupError(f"host name {value!r}: 1..64 letters, digits and . _ : - (e.g. h1 or gpu-3.lab)")
    return value


def slot_save_path(ns, cfg: dict) -> str | None:
    """--slot-save-path (else the run config's slot_save_path) made a private folder: created 0700, and an
    existing one of ours made 0700 (saved slots hold conversations); None: saved slots are off."""
    path = getattr(ns, "slot_save_path", None) or cfg.get("slot_save_path")
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise SetupError(f"--slot-save-path {path}: not a folder")
    private_dir(path)
    if os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o700)
    return path


def _responses_options(ns, cfg: dict) -> dict:
    """The stored Responses' folder and bounds (flags over the run config; Options' defaults otherwise)."""
    out = {}
    for flag, key in (("responses_dir", "responses_dir"), ("responses_max", "responses_max"),
                      ("responses_max_mib", "responses_max_mib"), ("responses_max_age", "responses_max_age_s")):
        value = getattr(ns, flag, None) if getattr(ns, flag, None) is not None else cfg.get(key)
        if value is None:
            continue
        if key != "responses_dir" and not float(value) > 0:
            raise SetupError(f"--{flag.replace('_', '-')} {value}: a number above 0")
        out[key] = os.path.abspath(os.path.expanduser(str(value))) if key == "responses_dir" else value
    return out


def stream_interval_ms(ns, cfg: dict) -> float:
    """--stream-interval-ms, else the run config's stream_interval_ms, else the HTTP limits' own
    ($STRATA_STREAM_INTERVAL_MS, else the default); within 0 .. 1000 (serve/http/pacing.py)."""
    value = getattr(ns, "stream_interval_ms", None)
    if value is None:
        value = cfg.get("stream_interval_ms")
    if value is None:
        return http_guard.Limits.from_env().stream_interval_s * 1e3
    try:
        return http_guard.stream_interval_s(value) * 1e3
    except (TypeError, ValueError):
        raise SetupError(f"stream_interval_ms {value!r}: a number of milliseconds, 0 to 1000") from None


def bind(opts: Options):
    """Bind the listening socket before anything loads -> the server (not yet serving). A busy or
    forbidden port is a SetupError in llama-server's words."""
    from serve.http.server import make_server
    try:
        return make_server(None, opts)
    except OSError as e:
        raise SetupError(f"couldn't bind HTTP server socket {opts.host}:{opts.port}: "
                         f"{e.strerror or e}") from None


def _keys(ns, cfg) -> list[str]:
    raw = list(getattr(ns, "api_key", None) or [])
    if not raw and os.environ.get("STRATA_API_KEY") is not None:
        raw = [os.environ["STRATA_API_KEY"]]
    if not raw and cfg.get("api_key") is not None:
        value = cfg["api_key"]
        raw = value if isinstance(value, list) else [value]
    keys = [k.strip() for item in raw for k in str(item).split(",")]
    if raw and (not keys or any(not k for k in keys)):
        raise SetupError("an API key is empty; give --api-key a non-empty value (or drop the flag)")
    return keys
