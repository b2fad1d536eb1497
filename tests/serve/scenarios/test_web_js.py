"""The web app's own JavaScript unit tests (tests/serve/scenarios/js/*.test.js: the markdown renderer, the stream
parser, the MCP client's framing), run with node's built-in test runner."""
import os
import shutil
import subprocess

import pytest

JS_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js")
NODE_TIMEOUT_S = 120   # the suites take about a second; a hung node must not hang pytest


@pytest.mark.parametrize("name", ["markdown.test.js", "stream.test.js", "mcp.test.js"])
def test_node_unit_tests(name):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JavaScript unit tests need it")
    r = subprocess.run([node, "--test", os.path.join(JS_TESTS, name)], capture_output=True, text=True,
                       timeout=NODE_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "# fail 0" in r.stdout
