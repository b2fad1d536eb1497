"""tools/cluster_figures.py over real network namespaces (tools/cluster_ns.py): three fake-engine hosts
(tools/cluster_host.py --echo: each reply is its request's own marker) behind deploy/haproxy.cfg, 12 clients
through the balancer (tools/cluster_drive.py). Skipped where namespaces cannot be made (not root, no `ip netns`,
no haproxy). The real-engine figures (prompt-cache reuse) are docs/DEPLOY.md's, from the same script."""
import pytest

from tools import cluster_figures, cluster_ns

REASON = cluster_ns.unusable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_affinity_and_failover_through_haproxy(tmp_path):
    args = cluster_figures.parse(["--fake", "--clients", "12", "--turns", "4", "--failover-s", "20",
                                  "--phases", "affinity,failover"])
    figures = cluster_figures.run(args, str(tmp_path))
    aff = figures["affinity"]
    assert aff["requests"] == 48 and aff["lost"] == 0 and aff["crossed"] == 0
    assert aff["conversations_on_one_host"] == aff["conversations"] == 12   # every turn on its first host
    assert len(aff["hosts"]) == 3
    # each host counted keep-alive reuse: HAProxy keeps its connections to the hosts
    assert all(m["strata:http_requests_reused_total"] > 0 for m in aff["metrics"].values())
    f = figures["failover"]
    assert f["crossed"] == 0
    # a dead host's replies that had begun never look finished (those that had not are resent by HAProxy)
    assert f["in_flight_at_kill"]["done"] == 0
    assert f["outcomes"]["http_error"] == f["outcomes"]["conn_error"] == 0   # no client saw a refusal or no answer
    # a dead engine's streams end with an error event, never cut and never as a clean end
    assert f["in_flight_at_engine_kill"]["cut"] == 0 and f["in_flight_at_engine_kill"]["conn_error"] == 0
    assert f["failed_after_kill"] == 0 and f["requests_after_kill"] > 8   # the survivors answered the rest
    assert f["down_after_s"] is not None and f["down_after_s"] < 6   # check inter 2 s, fall 2
    assert f["up_after_restart_s"] is not None and f["answered_after_return"] > 0
