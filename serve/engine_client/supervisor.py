"""Supervisor: restarts an engine that died while nobody used it (issue 10, "self-heal").

Role: one daemon thread per server. Every `POLL_S` it looks at the engine (anything with `alive()`,
`starting` and `restart(tries)`: serve.core.engine_api.EngineClient); a dead one that is not (re)starting,
and was not closed on purpose (`closed`: shutdown, an unload), is restarted after a backoff that doubles from `BACKOFF_FIRST_S` to `BACKOFF_MAX_S`, at most `RESTARTS_MAX`
times in a row (a success resets the count). Past the limit it gives up and says so once on stderr: /health
stays 503 with the death note, and the next request still tries once (Service.ensure_engine). It never
raises; it stops with `stop()` (server shutdown).

Public surface: `Supervisor(engine, log=print_to_stderr)`, `.start()`, `.stop()`, `.restarts`, `.gave_up`.
"""
from __future__ import annotations

import sys
import threading

POLL_S = 1.0            # how often the engine is looked at (a death is noticed within this)
BACKOFF_FIRST_S = 1.0   # the first restart waits this long (a crash loop does not spin)
BACKOFF_MAX_S = 60.0    # the wait doubles up to this
RESTARTS_MAX = 5        # restarts in a row before giving up (a model that cannot load fails fast anyway)


def _stderr(text: str) -> None:
    print(f"strata: {text}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, engine, log=_stderr):
        self.engine = engine
        self.log = log
        self.poll_s, self.backoff_first_s, self.backoff_max_s = POLL_S, BACKOFF_FIRST_S, BACKOFF_MAX_S
        self.restarts_max = RESTARTS_MAX
        self.restarts = 0        # restarts made (all of them)
        self.failures = 0        # failed restarts in a row
        self.gave_up = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="engine-supervisor")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = self.backoff_first_s
        while not self._stop.wait(self.poll_s):
            e = self.engine
            if e.alive() or e.starting or self.gave_up or getattr(e, "closed", False):
                if e.alive():
                    backoff, self.failures = self.backoff_first_s, 0
                continue
            self.log(f"the engine is down ({e.death_note()}); restarting it in {backoff:g} s")
            if self._stop.wait(backoff):
                return
            if e.alive() or e.starting or getattr(e, "closed", False):
                continue  # a request restarted it meanwhile, or it was closed on purpose
            try:
                e.restart(tries=1)
                self.restarts += 1
                self.log("the engine is running again")
            except Exception as err:  # EngineDied, EngineStuck: counted, retried later
                self.failures += 1
                backoff = min(self.backoff_max_s, backoff * 2)
                if self.failures >= self.restarts_max:
                    self.gave_up = True
                    self.log(f"the engine did not restart {self.failures} times in a row; giving up ({err})")
