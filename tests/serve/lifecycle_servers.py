"""Fake-engine Lifecycle servers for the lifecycle tests (tests/serve/test_lifecycle*.py): `lifecycle_servers`
(a generator a test file's own `lifecycle_server` fixture yields from), and the waits they share."""
import os
import time

from serve.engine_client.engine import StrataEngine
from serve.lifecycle import Lifecycle, ModelEntry
from serve.generation.service import Service
from tests.conftest import fake_argv
from tests.serve.conftest import start_http, stop_http
from tokenizer.bpe import ByteTokenizer

WAIT_S = 20.0   # generous: the machine is shared; nothing below depends on speed


def engine_pid(rec_file):
    with open(rec_file) as f:
        return int(f.readlines()[-1].split()[0])


def process_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:   # a zombie until its parent reaps it counts as gone
        import psutil
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:
        return True
    return False


def wait_until(check, timeout_s=WAIT_S):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def lifecycle_servers(tmp_path):
    """Yields start(names, lazy, idle_s, turn, ...) -> Running over a Lifecycle of fake engines; everything it
    started is stopped after the test."""
    started = []

    def start(names=("alpha", "beta"), lazy=True, idle_s=0.0, turn=None, config_path=None, lease_wait=False,
              max_loaded=1, ram_budget_bytes=None, info=None, templates=None, **opts):
        """`turn`: one turn for every model, or {name: turn}; `info`: {name: extra ModelEntry.info};
        `templates`: {name: chat template} (default ChatML)."""
        entries = []
        for n in names:
            own = turn.get(n) if isinstance(turn, dict) and "text" not in turn else turn
            script = {"record": str(tmp_path / f"{n}.rec"), "turns": [own or {"text": f"I am {n}."}]}
            argv = fake_argv(tmp_path, script)

            def make(argv=argv, n=n):
                engine = StrataEngine(argv, ["--max-context", "2048"], log_path=str(tmp_path / f"{n}.log"))
                return Service(engine, ByteTokenizer(), n, (templates or {}).get(n))
            entries.append(ModelEntry(n, make, aliases=[f"{n}-alias"],
                                      info={"n_ctx": 2048, "config_path": config_path, **(info or {}).get(n, {})}))
        lc = Lifecycle(entries, lazy_load=lazy, idle_unload_s=idle_s, lease_wait=lease_wait, max_loaded=max_loaded,
                       ram_budget_bytes=ram_budget_bytes)
        lc.lease_token = "the-token"
        run = start_http(lc, started, **opts)
        lc.boot()
        run.rec = lambda n: str(tmp_path / f"{n}.rec")
        return run

    yield start
    for run in started:
        stop_http(run)
        run.svc.close()
        run.svc.stop_engine()
