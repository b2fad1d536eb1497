"""A Service's figures and views: the history and totals a finished request leaves, and what /health,
/v1/status and /metrics read of them.

Role: `ServiceFigures` is the part of `Service` (serve/generation/service.py) that keeps and shows figures:
`_finish(record, t0)` files a finished request (history, totals, the last timings) under the Service's
`_lock`; `health()`, `status_view()` and `metrics_view(all_requests)` build the views. It holds no state of
its own: the fields it reads and writes (`engine`, `model_name`, `status`, `history`, `totals`,
`last_timings`, `queued`, `_lock`) are the Service's, set in `Service.__init__`.

Public surface: `ServiceFigures` (a base of `Service`).
"""
from __future__ import annotations

import time

from serve.core.engine_api import EngineFigures


class ServiceFigures:
    """The figures half of a Service (see the module docstring for the fields it uses)."""

    def _finish(self, record: dict, t0: float) -> None:
        """File a finished request: its engine figures (an EngineFigures, when a pass reported any) into the
        totals, and the record into the history with them in their logged form (`as_dict`)."""
        record["duration_s"] = time.monotonic() - t0
        fig = record.get("figures") or EngineFigures()
        record["figures"] = fig.as_dict()
        with self._lock:
            self.status = {"busy": False}
            self.history.append(record)
            tot = self.totals
            tot["requests"] += 1
            tot["prompt_tokens"] += record["prompt_tokens"]
            tot["reused"] += fig.reused or 0
            tot["output_tokens"] += record.get("output_tokens", 0)
            tot["prompt_ms"] += fig.prompt_ms or 0.0
            tot["decode_ms"] += fig.decode_ms or 0.0
            tot["drafts_offered"] += fig.drafts_off or 0   # draft tokens verified (engine/drafting.h)
            tot["drafts_accepted"] += fig.drafts_acc or 0
            tot["draft_steps"] += fig.drafts_n or 0         # verifications that carried a draft
            if record.get("finish") == "cancel":
                tot["cancelled"] += 1
            if record.get("finish") == "error":
                tot["errors"] += 1
            if record.get("timings"):
                self.last_timings = record["timings"]
            if fig.experts_hits is not None:   # engine-wide reads so far (engine/expert_tiers.h): the latest
                tot["experts_hits"], tot["experts_misses"] = fig.experts_hits, fig.experts_misses or 0

    # ---------------------------------------------------------------- views
    def health(self) -> tuple[int, dict]:
        e = self.engine
        loaded = e.alive()
        body = {"status": "ok" if loaded else ("loading" if e.starting else "unavailable"),
                "max_context": e.max_context or e.known_ctx, "model": self.model_name, "loaded": loaded,
                "service": "strata"}
        return (200 if loaded else 503), body

    def status_view(self) -> dict:
        with self._lock:
            st = dict(self.status, queued=self.queued)
        if st.get("busy") and st.get("started"):
            st["elapsed_s"] = round(time.time() - st["started"], 3)
            if st.get("first_token") and st.get("generated"):
                span = time.time() - st["first_token"]
                st["tokens_per_s"] = round(st["generated"] / span, 2) if span > 0 else None
        return st

    def metrics_view(self, all_requests: bool = False) -> dict:
        e = self.engine
        st = self.status_view()
        with self._lock:
            hist = list(self.history)
            totals = dict(self.totals)
        state = "unloaded" if not e.alive() else ("idle" if not st.get("busy") else
                                                  ("generating" if st.get("first_token") else "reading"))
        live = {"state": state, "queued": st.get("queued", 0), "phase": st.get("phase"),
                "prompt_tokens": st.get("prompt_tokens"), "generated": st.get("generated"),
                "max_tokens": st.get("max_tokens"), "elapsed_s": st.get("elapsed_s"),
                "tok_s": st.get("tokens_per_s"), "prefill_tok_s_mean": e.prefill_tok_s,
                "prompt_read": e.progress[0] if st.get("busy") else None}
        if getattr(e, "batch", None) is not None:  # decode slots (serve/engine_client/batch.py): per-slot view, counters
            live["slots"], live["batch"] = e.batch.slot_view(), e.batch.stats()
        replicas = e.live()   # per replica (ReplicaEngine); None for a single engine
        if replicas is not None:
            live["replicas"] = replicas
        records = hist[::-1] if all_requests else hist[::-1][:12]
        return {"engine": {"model": self.model_name, "max_context": e.max_context or e.known_ctx,
                           **{k: v for k, v in e.info.items() if not isinstance(v, dict)}},
                "live": live, "requests": records, "requests_kept": len(hist), "totals": totals,
                "expert_tiers": self.expert_tiers_view(), "time": time.time()}

    def expert_tiers_view(self) -> dict | None:
        """A MoE engine's expert split (INFO experts_total / experts_resident / experts_packed_mib) and the reads
        its requests reported (DONE / BDONE experts_hits / experts_misses, engine-wide); None for a dense model."""
        info = self.engine.info or {}
        total = info.get("experts_total")
        if not total:
            return None
        with self._lock:
            hits, misses = self.totals.get("experts_hits"), self.totals.get("experts_misses")
        reads = (hits or 0) + (misses or 0)
        return {"total": total, "resident": info.get("experts_resident"),
                "packed_mib_all": info.get("experts_packed_mib") or None, "hits": hits, "misses": misses,
                "hit_rate": round(hits / reads, 4) if reads else None}
