"""GET /openapi.json (issue 25): an OpenAPI 3.1 document built from the route tables lists every route the server
answers, and schemathesis fuzzes every operation from it against a server on the fake engine: positive cases
(bodies the document allows) and negative ones (bodies it forbids), at least 2,000 in all, with no 5xx, no
hang (every call has a time limit), every status, content type and body conforming to the document, and the
server healthy after."""
import collections
import time

import jsonschema
import pytest

from serve.api import schemas
from serve.http import openapi, routes

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a test-only dependency "
                                   "(requirements-test.txt); ./strata test installs it")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402  (after the import check)
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode, checks  # noqa: E402

CASES_PER_MODE = 25      # at most, per operation and mode (a GET without parameters has 1): ~2,500 cases in all
CALL_TIMEOUT_S = 30      # a call that takes longer is a hang, and fails the test
# schemathesis's not_a_server_error counts 501 too; here 501 is the documented answer of a feature Strata does
# not offer (Ollama's hub: pull, push, create, copy, delete; saved slots without --slot-save-path), so the
# test checks 5xx itself and lets 501 alone pass
CHECKS = [checks.status_code_conformance, checks.content_type_conformance, checks.response_schema_conformance]
NOT_OFFERED = 501
# what the fake engine says: short answers, so a fuzzed max_tokens of 10^9 still ends at once
SCRIPT = {"turns": [{"text": "Hello from the fake engine."}]}


def _table_operations():
    ops = {(m, p) for m, table in (("get", routes.GET_ROUTES), ("post", routes.POST_ROUTES),
                                   ("delete", routes.DELETE_ROUTES)) for p in table}
    ops |= {(m.lower(), f"{prefix}{{{openapi.PREFIX_PARAMS[prefix]}}}") for m, prefix in routes.PREFIX_ROUTES}
    return ops


def test_the_document_lists_every_route_of_the_tables(server):
    s = server(SCRIPT)
    status, doc, _ = s.request("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    listed = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert listed == _table_operations()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "post" and routes.POST_ROUTES.get(path) is not None:
                assert "requestBody" in op, f"POST {path}: its handler has no body schema in serve/api/schemas.py"
            for answer in op["responses"].values():
                for media in answer.get("content", {}).values():
                    jsonschema.Draft202012Validator.check_schema(media["schema"])
            for media in op.get("requestBody", {}).get("content", {}).values():
                jsonschema.Draft202012Validator.check_schema(media["schema"])
    assert doc["paths"]["/chat/completions"]["post"]["requestBody"] == \
        doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]   # an alias gets its handler's schema
    ollama_error = doc["paths"]["/api/chat"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert ollama_error == schemas.ERROR_BODIES["ollama"]


def test_a_schema_a_valid_body_satisfies_is_one_the_server_takes(server):
    """The document is not looser than the server: a body built by the schema's own example fields works."""
    s = server(SCRIPT)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.5}
    jsonschema.validate(body, schemas.OPENAI_CHAT)
    status, out, _ = s.post("/v1/chat/completions", body)
    assert status == 200
    jsonschema.validate(out, schemas.CHAT_COMPLETION)


def _fuzz(op, mode, base, counts):
    @settings(max_examples=CASES_PER_MODE, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case):
        started = time.monotonic()
        response = case.call(base_url=base, timeout=CALL_TIMEOUT_S)
        counts["cases"] += 1
        counts[f"{response.status_code // 100}xx"] += 1
        if response.status_code == NOT_OFFERED:
            counts["501"] += 1
        counts["slowest_s"] = max(counts["slowest_s"], time.monotonic() - started)
        assert response.status_code < 500 or response.status_code == NOT_OFFERED, \
            (response.status_code, response.text[:300], case.as_curl_command())
        case.validate_response(response, checks=CHECKS)
    try:
        run()
    except Unsatisfiable:   # a negative mode with nothing to break (an operation without body or parameters)
        counts["no_cases"] += 1


def test_every_operation_fuzzed_from_the_document(server):
    s = server(SCRIPT)
    status, doc, _ = s.request("GET", "/openapi.json")
    assert status == 200
    schema = schemathesis.openapi.from_dict(doc)
    base = f"http://127.0.0.1:{s.port}"
    counts = collections.Counter()
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(op, mode, base, counts)
    took = time.monotonic() - started
    print(f"schemathesis: {counts['cases']} cases over {len(operations)} operations in {took:.0f} s: "
          f"{dict(counts)}")
    assert counts["cases"] >= 2000 and counts["5xx"] == counts["501"]
    assert s.request("GET", "/health")[0] == 200
    assert s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})[0] == 200
