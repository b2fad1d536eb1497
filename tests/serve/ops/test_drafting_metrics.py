"""The engine's draft figures (DONE's drafts_acc/drafts_off, BDONE's drafts_acc=/drafts_off=) reach the totals,
both Prometheus expositions (strata:drafts_*_total; vLLM's spec_decode_* names) and llama.cpp's timings
(draft_n, draft_n_accepted); an engine that does not draft leaves them at 0 and the timings without them."""
import pytest

from tests.serve.conftest import chat

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client (requirements-test.txt) "
                             "is the independent parser every exposition must satisfy")


def _values(s):
    out = {}
    for path in ("/metrics/prometheus", "/metrics?format=prometheus"):
        status, text, _ = s.request("GET", path)
        assert status == 200
        for fam in parser.text_string_to_metric_families(text):
            for x in fam.samples:
                if "draft" in x.name or "spec_decode" in x.name:
                    assert fam.type == "counter", x.name
                    out[(path, x.name)] = x.value
    return out


def test_one_slot_drafts_reach_totals_metrics_and_timings(server):
    s = server({"turns": [{"text": "abcdef", "drafts": [3, 5, 2]}]})
    for _ in range(2):
        status, body, _ = s.post("/v1/chat/completions", chat("hi"))
        assert status == 200
    assert body["timings"]["draft_n"] == 5 and body["timings"]["draft_n_accepted"] == 3
    assert s.svc.totals["drafts_offered"] == 10 and s.svc.totals["drafts_accepted"] == 6
    v = _values(s)
    assert v[("/metrics/prometheus", "strata:drafts_offered_total")] == 10
    assert v[("/metrics/prometheus", "strata:drafts_accepted_total")] == 6
    assert v[("/metrics?format=prometheus", "vllm:spec_decode_num_draft_tokens_total")] == 10
    assert v[("/metrics?format=prometheus", "vllm:spec_decode_num_accepted_tokens_total")] == 6
    assert v[("/metrics?format=prometheus", "strata:drafts_offered_total")] == 10
    # llama.cpp's names (GET /metrics, as llama-server): tokens verified, accepted, verification steps (drafts_n=)
    assert v[("/metrics?format=prometheus", "llamacpp:spec_decode_num_draft_tokens_total")] == 10
    assert v[("/metrics?format=prometheus", "llamacpp:spec_decode_num_accepted_tokens_total")] == 6
    assert v[("/metrics/prometheus", "llamacpp:spec_decode_num_drafts_total")] == 4


def test_no_drafting_leaves_zero_and_no_draft_timings(server):
    s = server({"turns": [{"text": "abc", "drafts": None}]})
    status, body, _ = s.post("/v1/chat/completions", chat("hi"))
    assert status == 200 and "draft_n" not in body["timings"]
    v = _values(s)
    assert v[("/metrics/prometheus", "strata:drafts_offered_total")] == 0
    assert v[("/metrics?format=prometheus", "vllm:spec_decode_num_accepted_tokens_total")] == 0


def test_slot_drafts_from_bdone_keys(slot_server):  # noqa: F811
    s = slot_server({"slots": 2, "drafts": [2, 4, 3]})
    for q in ("q1", "q2", "q3"):
        assert s.post("/v1/chat/completions", chat(q))[0] == 200
    assert s.svc.totals["drafts_offered"] == 12 and s.svc.totals["drafts_accepted"] == 6
    v = _values(s)
    assert v[("/metrics?format=prometheus", "vllm:spec_decode_num_draft_tokens_total")] == 12
    assert v[("/metrics?format=prometheus", "llamacpp:spec_decode_num_drafts_total")] == 9
