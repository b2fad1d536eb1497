#!/usr/bin/env bash
# Several Strata hosts behind HAProxy (deploy/haproxy.cfg), each in its own network namespace:
#   ${P}lb  HAProxy on its loopback 127.0.0.1:8080, linked by a veth pair to each host
#   ${P}h1  a Strata server on 10.231.1.2:8080 (tools/cluster_host.py: the fake engine, answers "h1")
#   ${P}h2  the same on 10.231.2.2:8080 (answers "h2")
# Only namespace addresses and loopback are used; nothing touches the host's own network. Checks: a
# conversation stays on one host whatever its JSON field order, conversations spread over both hosts, a host
# whose server stops leaves the ring (active /health checks) and its conversations move.
# Bounded (every wait has a limit; the hosts exit by themselves after 180 s) and cleaned up on any exit.
# Skips (exit 0, with the reason) where namespaces cannot be made (not root, no `ip netns`) or no haproxy.
# Usage: sudo tools/cluster_test.sh        (needs: iproute2, haproxy, the repository's Python deps)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
P="strata_ct$$_"
PIDS=()

skip() { echo "cluster_test: skipped: $*"; exit 0; }
command -v haproxy >/dev/null || skip "no haproxy binary (apt-get install haproxy)"
command -v ip >/dev/null || skip "no ip command (iproute2)"
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
ip netns add "${P}probe" 2>/dev/null || skip "ip netns add failed (no namespace support here)"
ip netns del "${P}probe"

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -9 "$pid" 2>/dev/null || true; done
  for ns in lb h1 h2; do ip netns del "${P}$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

for ns in lb h1 h2; do
  ip netns add "${P}$ns"
  ip -n "${P}$ns" link set lo up
done
for i in 1 2; do   # veth lb<->h$i: 10.231.$i.1 (lb side) / 10.231.$i.2 (host side)
  ip link add "ct$$l$i" netns "${P}lb" type veth peer name "ct$$h$i" netns "${P}h$i"
  ip -n "${P}lb" addr add "10.231.$i.1/24" dev "ct$$l$i"
  ip -n "${P}lb" link set "ct$$l$i" up
  ip -n "${P}h$i" addr add "10.231.$i.2/24" dev "ct$$h$i"
  ip -n "${P}h$i" link set "ct$$h$i" up
done

for i in 1 2; do
  ip netns exec "${P}h$i" timeout 200 "$PY" "$ROOT/tools/cluster_host.py" --host "10.231.$i.2" --port 8080 \
    --name "h$i" --seconds 180 &
  PIDS+=($!)
done
STRATA_LUA="$ROOT/deploy/strata_affinity.lua" STRATA_BIND=127.0.0.1:8080 STRATA_H1=10.231.1.2:8080 \
  STRATA_H2=10.231.2.2:8080 ip netns exec "${P}lb" timeout 200 haproxy -db -f "$ROOT/deploy/haproxy.cfg" &
PIDS+=($!)
H1_PID="${PIDS[0]}"

ip netns exec "${P}lb" timeout 120 "$PY" - "$H1_PID" <<'PYEOF'
import http.client, json, os, signal, sys, time

def ask(body, headers=None):
    deadline = time.monotonic() + 30
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", 8080, timeout=30)
            c.request("POST", "/v1/chat/completions", body=body if isinstance(body, str) else json.dumps(body),
                      headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            raw = r.read()
            if r.status == 200:
                return json.loads(raw)["choices"][0]["message"]["content"]
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            sys.exit("cluster_test: FAIL: no answer through HAProxy")
        time.sleep(0.3)

def health(addr):
    try:
        c = http.client.HTTPConnection(addr, 8080, timeout=2)
        c.request("GET", "/health")
        return c.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False

deadline = time.monotonic() + 30   # both hosts up, then HAProxy's checks (inter 2s, rise 2) see them up
while not (health("10.231.1.2") and health("10.231.2.2")):
    assert time.monotonic() < deadline, "the hosts did not start"
    time.sleep(0.3)
deadline = time.monotonic() + 20
while {ask({"messages": [{"role": "user", "content": f"topic {i}"}]}) for i in range(16)} != {"h1", "h2"}:
    assert time.monotonic() < deadline, "HAProxy never sent conversations to both hosts"
    time.sleep(0.5)

first = {"role": "user", "content": "conversation alpha"}
homes = {ask({"messages": [first]}),
         ask({"messages": [{"role": "system", "content": "x"}, first, {"role": "assistant", "content": "a"},
                           {"role": "user", "content": "b"}]}),
         ask('{"model": "m", "messages": [{"content": "conversation alpha", "role": "user"}]}')}
assert len(homes) == 1, f"one conversation went to {homes}"
spread = {ask({"messages": [{"role": "user", "content": f"topic {i}"}]}) for i in range(16)}
assert spread == {"h1", "h2"}, f"16 conversations went only to {spread}"
print(f"cluster_test: affinity ok (alpha -> {homes.pop()}), 16 conversations over {sorted(spread)}")
os.kill(int(sys.argv[1]), signal.SIGTERM)   # h1's server stops: its /health fails, it leaves the ring
deadline = time.monotonic() + 30
while {ask({"messages": [{"role": "user", "content": f"topic {i}"}]}) for i in range(8)} != {"h2"}:
    assert time.monotonic() < deadline, "h1's conversations never moved to h2"
    time.sleep(0.5)
print("cluster_test: failover ok (h1 stopped: every conversation on h2)")
PYEOF
echo "cluster_test: passed"
