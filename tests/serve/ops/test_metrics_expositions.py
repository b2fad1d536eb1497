"""Every Prometheus exposition parses with the official parser (prometheus-client), with the right names,
types and help texts; histogram counts match the requests; integers are exact; running / deferred count
requests with lanes; /metrics is text by default, JSON for the Monitor when asked; rejected requests are counted and listed;
/about.json lists every route of the server's route tables."""
import threading
import time

import pytest

from serve.ops import metrics_views
from serve.http import routes as routes_mod
from tests.serve.conftest import chat

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client (requirements-test.txt) "
                             "is the independent parser every exposition must satisfy")

LLAMA_NAMES = {  # name -> (type, help) as llama-server b9553 writes them (PEERS.md §1.7)
    "llamacpp:prompt_tokens_total": ("counter", "Number of prompt tokens processed."),
    "llamacpp:prompt_seconds_total": ("counter", "Prompt process time"),
    "llamacpp:tokens_predicted_total": ("counter", "Number of generation tokens processed."),
    "llamacpp:tokens_predicted_seconds_total": ("counter", "Predict process time"),
    "llamacpp:n_decode_total": ("counter", "Total number of llama_decode() calls"),
    "llamacpp:n_tokens_max": ("counter", "Largest observed n_tokens."),
    "llamacpp:prompt_tokens_seconds": ("gauge", "Average prompt throughput in tokens/s."),
    "llamacpp:predicted_tokens_seconds": ("gauge", "Average generation throughput in tokens/s."),
    "llamacpp:requests_processing": ("gauge", "Number of requests processing."),
    "llamacpp:requests_deferred": ("gauge", "Number of requests deferred."),
    "llamacpp:n_busy_slots_per_decode": ("gauge", "Average number of busy slots per llama_decode() call"),
}
VLLM_TYPES = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
              "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter",
              "vllm:generation_tokens": "counter", "vllm:prefix_cache_queries": "counter",
              "vllm:prefix_cache_hits": "counter", "vllm:num_preemptions": "counter",
              "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
              "vllm:inter_token_latency_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram"}


VLLM_HELP = {  # vLLM's own help texts (vllm/v1/metrics/loggers.py)
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of end to end request latency in seconds."}


def families(text):
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def sample(fams, name, suffix="", **labels):
    fam = fams[name]
    for s in fam.samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((name, suffix, labels))


def _get_text(s, path, headers=None):
    status, text, r = s.request("GET", path, headers=headers)
    assert status == 200 and r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    return text


def test_llama_names_types_help_and_exact_integers(server):
    s = server({"turns": [{"text": "Hello there"}]})
    for _ in range(3):
        assert s.post("/v1/chat/completions", chat("hi"))[0] == 200
    s.svc.totals["output_tokens"] = 1234567          # a counter past a million is written exactly
    s.svc.totals["prompt_ms"] = 1500.0
    text = _get_text(s, "/metrics/prometheus")
    assert "e+" not in text
    assert "\nllamacpp:tokens_predicted_total 1234567\n" in text
    fams = families(text)
    for name, (kind, help_text) in LLAMA_NAMES.items():
        fam_name = name[:-len("_total")] if kind == "counter" and name.endswith("_total") else name
        assert fams[fam_name].type == kind, name
        assert fams[fam_name].documentation == help_text, name
    assert sample(fams, "llamacpp:prompt_seconds", "_total") == 1.5
    # three requests one after another of 11 tokens (the text) + the end token each: one decode per token
    assert sample(fams, "llamacpp:n_decode", "_total") == 36
    assert sample(fams, "llamacpp:n_busy_slots_per_decode") == 1.0
    assert sample(fams, "llamacpp:requests_processing") == 0
    assert sample(fams, "strata:requests", "_total") == 3


def test_metrics_is_text_by_default_and_json_when_asked(server):
    """GET /metrics answers as llama-server does (Prometheus text, llama.cpp's names, Process-Start-Time-Unix)
    with vLLM's families after them; JSON (the Monitor's) only for ?format=json or an Accept of JSON."""
    s = server({"turns": [{"text": "abcd"}]})
    for _ in range(2):
        assert s.post("/v1/chat/completions", chat("hi"))[0] == 200
    st, events, _ = s.stream(chat("hi"))
    assert st == 200
    for path, headers in (("/metrics?format=json", None), ("/metrics", {"Accept": "application/json"})):
        status, body, r = s.request("GET", path, headers=headers)
        assert status == 200 and "json" in r.getheader("Content-Type") and body["totals"]["requests"] == 3
        assert abs(int(r.getheader("Process-Start-Time-Unix")) - s.svc.started) < 1
    plain = _get_text(s, "/metrics")   # no Accept, as curl and llama.cpp's suite ask
    by_star = _get_text(s, "/metrics", {"Accept": "*/*"})
    by_query = _get_text(s, "/metrics?format=prometheus")
    by_accept = _get_text(s, "/metrics", {"Accept": "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"})
    by_openmetrics = _get_text(s, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert s.request("GET", "/metrics")[2].getheader("Process-Start-Time-Unix") == str(int(s.svc.started))
    for text in (plain, by_star, by_query, by_accept, by_openmetrics):
        fams = families(text)
        for name, (kind, help_text) in LLAMA_NAMES.items():
            fam_name = name[:-len("_total")] if kind == "counter" and name.endswith("_total") else name
            assert fams[fam_name].type == kind and fams[fam_name].documentation == help_text, name
        for name in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "spec_decode_num_drafts"):
            assert fams["llamacpp:" + name].type == "counter", name
        assert sample(fams, "llamacpp:tokens_predicted", "_total") == 3 * 5
        for name, kind in VLLM_TYPES.items():
            assert fams[name].type == kind, name
            assert fams[name].documentation == VLLM_HELP.get(name, fams[name].documentation), name
            assert all(x.labels.get("model_name") == "fake-model" for x in fams[name].samples), name
        # histogram counts match the requests: 3 finished, 3 first tokens, (4 + the end token - 1) gaps each
        assert sample(fams, "vllm:e2e_request_latency_seconds", "_count", model_name="fake-model") == 3
        assert sample(fams, "vllm:time_to_first_token_seconds", "_count") == 3
        assert sample(fams, "vllm:inter_token_latency_seconds", "_count") == 3 * 4
        assert sample(fams, "vllm:e2e_request_latency_seconds", "_bucket", le="+Inf") == 3
        ttft_bounds = [x.labels["le"] for x in fams["vllm:time_to_first_token_seconds"].samples
                       if x.name.endswith("_bucket")]
        assert len(ttft_bounds) == 23 and ttft_bounds[0] == "0.001" and ttft_bounds[-2] == "2560.0"
        e2e_bounds = [x.labels["le"] for x in fams["vllm:e2e_request_latency_seconds"].samples
                      if x.name.endswith("_bucket")]
        assert e2e_bounds[0] == "0.3" and e2e_bounds[-2] == "7680.0" and len(e2e_bounds) == 22
        assert sample(fams, "vllm:request_success", "_total", finished_reason="stop") == 3
        assert sample(fams, "vllm:generation_tokens", "_total") == 3 * 5
        assert fams["strata:slots"].type == "gauge" and fams["strata:ram_total_bytes"].type == "gauge"


def test_requests_processing_counts_every_lane(slot_server):  # noqa: F811
    s = slot_server({"slots": 4, "repeat": 200, "step_delay_s": 0.02})
    done = []
    threads = [threading.Thread(target=lambda i=i: done.append(s.post("/v1/chat/completions",
                                                                       chat(f"lane{i}"), timeout=60)[0]))
               for i in range(3)]
    for t in threads:
        t.start()
    seen = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and seen < 3:
        fams = families(_get_text(s, "/metrics/prometheus"))
        seen = max(seen, sample(fams, "llamacpp:requests_processing"))
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    assert seen == 3, "three requests in three decode slots are three processing, not 0/1"
    assert done == [200, 200, 200]
    fams = families(_get_text(s, "/metrics/prometheus"))
    assert sample(fams, "llamacpp:requests_processing") == 0
    assert sample(fams, "llamacpp:n_busy_slots_per_decode") > 1.0  # steps were shared by several slots


def test_more_requests_than_slots_are_deferred(slot_server):  # noqa: F811
    s = slot_server({"slots": 2, "repeat": 100, "step_delay_s": 0.02})
    threads = [threading.Thread(target=lambda i=i: s.post("/v1/chat/completions", chat(f"q{i}"), timeout=90))
               for i in range(4)]
    for t in threads:
        t.start()
    seen = set()
    while any(t.is_alive() for t in threads):   # every state until the four are answered (each ends in 90 s)
        fams = families(_get_text(s, "/metrics/prometheus"))
        seen.add((sample(fams, "llamacpp:requests_processing"), sample(fams, "llamacpp:requests_deferred")))
        time.sleep(0.02)
    assert (2, 2) in seen, seen                       # two slots busy, two requests waiting for one
    assert all(p <= 2 for p, _ in seen), seen


def test_a_one_slot_engine_has_one_processing_one_deferred(server):
    s = server({"turns": [{"text": "slow", "repeat": 100, "token_delay_s": 0.01}]})
    threads = [threading.Thread(target=lambda: s.post("/v1/chat/completions", chat("hi"), timeout=60))
               for _ in range(2)]
    for t in threads:
        t.start()
    seen = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (1, 1) not in seen:
        fams = families(_get_text(s, "/metrics/prometheus"))
        seen.add((sample(fams, "llamacpp:requests_processing"), sample(fams, "llamacpp:requests_deferred")))
        time.sleep(0.02)
    for t in threads:
        t.join(60)
    assert (1, 1) in seen and all(p <= 1 for p, _ in seen)


def test_a_gpu_reaches_metrics_json_and_text(server, nvml_stub, monkeypatch):
    monkeypatch.setenv("STRATA_NVML_LIB", nvml_stub)
    s = server()
    metrics_views.ensure_sampler(s.svc)
    status, m, _ = s.request("GET", "/metrics?format=json")
    assert [g["name"] for g in m["hardware"]["gpus"]] == ["Stub GPU A", "Stub GPU B"]
    assert m["history"]["series"]["gpu_util"][-1] == 41.5
    fams = families(_get_text(s, "/metrics?format=prometheus"))
    assert sample(fams, "strata:gpu_util_percent", gpu="nvidia1", model_name="fake-model") == 42.0
    assert sample(fams, "strata:gpu_power_watts", gpu="nvidia0") == 250.5
    assert all(x.labels["gpu"] != "nvidia1" for x in fams["strata:gpu_power_watts"].samples)  # unknown: left out


def test_rejected_requests_are_counted_and_listed(server):
    s = server(ctx=256)
    status, body, _ = s.post("/v1/chat/completions", chat("x" * 2000))
    assert status == 400
    assert s.post("/v1/chat/completions", {"messages": "nope"})[0] == 400
    status, m, _ = s.request("GET", "/metrics?format=json")
    assert m["rejected_total"] == 2
    assert m["rejected"][0]["finish"] == "rejected" and m["rejected"][0]["status"] == 400
    assert "context" in m["rejected"][1]["error"] or "256" in m["rejected"][1]["error"]
    fams = families(_get_text(s, "/metrics/prometheus"))
    assert sample(fams, "strata:requests_rejected", "_total") == 2
    # a normal question still works after the context error
    assert s.post("/v1/chat/completions", chat("hi"))[0] == 200


def test_metrics_json_has_history_hardware_and_cache_card(server):
    s = server()
    assert s.post("/v1/chat/completions", chat("hi"))[0] == 200
    metrics_views.ensure_sampler(s.svc).sample()
    status, m, _ = s.request("GET", "/metrics?format=json")
    h = m["history"]
    assert len(h["t"]) >= 2
    for key in ("decode_tok_s", "prefill_tok_s", "ttft_s", "running", "deferred", "slots_busy", "context_use",
                "cpu", "ram_used", "rss_server"):
        assert key in h["series"] and len(h["series"][key]) == len(h["t"]), key
    assert m["hardware"]["ram_total"] > 0 and "gpus" in m["hardware"]
    assert m["live"]["slots_total"] == 1 and m["live"]["processing"] == 0
    assert m["conversation_cache"]["prompt_tokens"] == m["totals"]["prompt_tokens"]


def test_about_json_lists_every_route_with_its_dialect(server, monkeypatch):
    s = server()
    monkeypatch.setitem(routes_mod.POST_ROUTES, "/api/chat", lambda svc, b, c: None)  # a route added later
    status, a, _ = s.request("GET", "/about.json")
    assert status == 200
    listed = {(r["method"], r["path"]): r["dialect"] for r in a["routes"]}
    for path in routes_mod.GET_ROUTES:
        assert ("GET", path) in listed, path
    for path in routes_mod.POST_ROUTES:
        assert ("POST", path) in listed, path
    assert listed[("POST", "/v1/chat/completions")] == "OpenAI"
    assert listed[("POST", "/api/chat")] == "Ollama"
    assert listed[("GET", "/props")] == "llama.cpp"
    assert listed[("GET", "/api/health")] == "Strata"
    assert listed[("GET", "/")] == "web app"
    if ("POST", "/v1/messages") in listed:
        assert listed[("POST", "/v1/messages")] == "Anthropic"
    assert a["uptime_s"] >= 0 and a["model"]["name"] == "fake-model" and a["machine"]["cores_logical"] >= 1
