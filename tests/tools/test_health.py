"""tools/health.py: GET /health polled until 200, the process's end, or the time limit."""
import http.server
import subprocess
import sys
import threading
import time

from tools.health import wait_healthy


def _server(statuses):
    """A local server answering /health with each of `statuses` in turn (the last repeats)."""
    left = list(statuses)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(left.pop(0) if len(left) > 1 else left[0])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd


def test_waits_through_a_loading_server_until_it_answers_200():
    httpd = _server([503, 503, 200])
    try:
        assert wait_healthy(httpd.server_address[1], 10, poll_s=0.01)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_gives_up_at_the_time_limit_or_when_the_process_has_ended():
    httpd = _server([503])
    try:
        t0 = time.monotonic()
        assert not wait_healthy(httpd.server_address[1], 0.3, poll_s=0.05)
        assert 0.3 <= time.monotonic() - t0 < 5
    finally:
        httpd.shutdown()
        httpd.server_close()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(30)
    t0 = time.monotonic()
    assert not wait_healthy(1, 30, ended) and time.monotonic() - t0 < 5
