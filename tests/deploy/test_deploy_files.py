"""deploy/: the systemd unit passes systemd's own check (but for its install path), the Prometheus file has a
target per HAProxy server and parses, and HAProxy accepts its configuration with affinity and with round robin."""
import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

DEPLOY = os.path.join(ROOT, "deploy")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_systemd_unit_verifies():
    r = subprocess.run(["systemd-analyze", "verify", os.path.join(DEPLOY, "strata.service")], capture_output=True,
                       text=True, timeout=60)
    problems = [line for line in (r.stdout + r.stderr).splitlines()
                if line.strip() and "/opt/strata/strata" not in line]   # the install path need not exist here
    assert problems == []


def test_prometheus_has_a_target_per_haproxy_server():
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(DEPLOY, "prometheus.yml")) as f:
        jobs = yaml.safe_load(f)["scrape_configs"]
    with open(os.path.join(DEPLOY, "haproxy.cfg")) as f:
        servers = re.findall(r"^\s*server\s+(\S+)", f.read(), re.M)
    assert [j["job_name"] for j in jobs] == ["strata"] and jobs[0]["metrics_path"] == "/metrics"
    assert len(jobs[0]["static_configs"][0]["targets"]) == len(servers) == 3


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy binary (Debian package haproxy)")
@pytest.mark.parametrize("balance", [None, "roundrobin"])
def test_haproxy_accepts_the_configuration(balance):
    env = {**os.environ, "STRATA_LUA": os.path.join(DEPLOY, "strata_affinity.lua"),
           **{f"STRATA_H{i}": f"127.0.0.1:{i}" for i in (1, 2, 3)}}
    env.pop("STRATA_BALANCE", None)
    if balance:
        env["STRATA_BALANCE"] = balance
    r = subprocess.run(["haproxy", "-c", "-f", os.path.join(DEPLOY, "haproxy.cfg")], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
