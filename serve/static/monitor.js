// Strata web app: the Monitor page. Polls GET /metrics (JSON) once a second and draws its `history` (one
// sample a second per series, serve/ops/telemetry.py) as small SVG line charts drawn here, plus the live cards,
// the conversation-cache card and the recent requests (rejected ones too).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_W = 300, CHART_H = 90;   // the SVG's own units; it stretches to the card's width
const WINDOW_MIN = 60;               // a chart spans at least this many samples (a minute), newest at the right

// [id, title, [[series, legend]], unit formatter, fixed maximum or null]
const CHARTS = [
  ["tok", "tokens/s", [["decode_tok_s", "decode"], ["prefill_tok_s", "prefill"]], v => fmtNumber(v), null],
  ["ttft", "time to first token", [["ttft_s", "s"]], v => `${fmtNumber(v, 2)} s`, null],
  ["queue", "requests", [["running", "running"], ["deferred", "waiting"]], v => fmtNumber(v, 0), null],
  ["slots", "slots busy", [["slots_busy", "busy"]], v => fmtNumber(v, 0), "slots_total"],
  ["ctx", "KV / context use", [["context_use", "%"]], v => `${fmtNumber(v)} %`, 100],
  ["cpu", "CPU", [["cpu", "%"]], v => `${fmtNumber(v)} %`, 100],
  ["ram", "RAM", [["ram_used", "used"]], fmtBytes, "ram_total"],
  ["rss", "process memory", [["rss_server", "server"], ["rss_engine", "engine"]], fmtBytes, null],
  ["io", "disk / network", [["disk_read_bps", "disk read"], ["disk_write_bps", "disk write"], ["net_in_bps", "net in"]],
   v => `${fmtBytes(v)}/s`, null],
  ["gpu", "GPU utilisation", [["gpu_util", "%"]], v => `${fmtNumber(v)} %`, 100],
  ["gpumem", "GPU memory", [["gpu_mem_used", "used"]], fmtBytes, null],
  ["gputemp", "GPU temperature / power", [["gpu_temp", "°C"], ["gpu_power", "W"]], v => fmtNumber(v), null],
];

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function chartCard(id, title, series) {
  const card = el("div", "chart");
  card.id = `chart-${id}`;
  const head = el("div", "head");
  head.append(el("span", "", title), el("b", "value", "–"));
  const svg = svgEl("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, preserveAspectRatio: "none", role: "img" });
  svg.setAttribute("aria-label", title);
  const legend = el("div", "legend");
  series.forEach(([, name], i) => {
    const swatch = el("i");
    swatch.style.background = `var(--${i === 0 ? "chart" : i === 1 ? "chart2" : "chart3"})`;
    legend.append(swatch, document.createTextNode(name));
  });
  card.append(head, svg, legend);
  return card;
}

// Polylines of one series; a None value breaks the line.
function linePaths(values, n, top) {
  const paths = [];
  let cur = [];
  values.forEach((v, i) => {
    if (v === null || v === undefined) { if (cur.length) paths.push(cur); cur = []; return; }
    const span = Math.max(WINDOW_MIN, n) - 1;
    const x = CHART_W - ((n - 1 - i) / span) * CHART_W;
    const y = CHART_H - 4 - (Math.max(0, v) / top) * (CHART_H - 8);
    cur.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  if (cur.length) paths.push(cur);
  return paths;
}

function drawChart(card, hist, series, fmt, fixedMax, latest) {
  const svg = card.querySelector("svg");
  svg.textContent = "";
  const all = series.map(([key]) => hist.series[key] || []);
  const n = hist.t.length;
  let top = typeof fixedMax === "number" ? fixedMax :
    (typeof fixedMax === "string" ? latest[fixedMax] : null);
  const seen = Math.max(0, ...all.flat().filter(v => typeof v === "number"));
  if (!top || top < seen) top = seen > 0 ? seen * 1.15 : 1;
  for (const f of [0.25, 0.5, 0.75]) {
    const y = (CHART_H - 4 - f * (CHART_H - 8)).toFixed(1);
    svg.appendChild(svgEl("line", { class: "grid", x1: 0, x2: CHART_W, y1: y, y2: y }));
  }
  all.forEach((values, s) => {
    for (const pts of linePaths(values, n, top)) {
      if (pts.length === 1) {  // a lone sample (a TTFT in a quiet minute) is a dot
        const [cx, cy] = pts[0].split(",");
        svg.appendChild(svgEl("circle", { class: `dot s${s}`, cx, cy, r: 2.5 }));
      } else {
        svg.appendChild(svgEl("polyline", { class: `line s${s}`, points: pts.join(" ") }));
      }
    }
  });
  const label = svgEl("text", { x: 3, y: 11 });
  label.textContent = fmt(top);
  svg.appendChild(label);
  const last = all.map(v => {  // the latest known sample (sparse series such as TTFT keep their last one)
    for (let i = v.length - 1; i >= 0; i--) if (v[i] !== null && v[i] !== undefined) return v[i];
    return null;
  });
  card.querySelector(".value").textContent = last.map(v => (v === null || v === undefined) ? "–" : fmt(v)).join(" / ");
  card.dataset.points = String(all.reduce((a, v) => a + v.filter(x => x !== null && x !== undefined).length, 0));
}

function requestRows(m) {
  const rows = [...(m.requests || []), ...(m.rejected || [])].sort((a, b) => b.time - a.time).slice(0, 25);
  const tbody = document.getElementById("rows");
  tbody.textContent = "";
  for (const r of rows) {
    const tr = el("tr", r.finish === "rejected" ? "rejected" : "");
    const t = r.timings || {};
    const cells = r.finish === "rejected"
      ? [new Date(r.time * 1000).toLocaleTimeString(), `rejected ${r.status}`, r.path || "", r.error || "", "", "", "", ""]
      : [new Date(r.time * 1000).toLocaleTimeString(), r.finish || "running", r.api || "", fmtNumber(r.prompt_tokens),
         fmtNumber(t.cache_n), fmtNumber(r.output_tokens), fmtNumber(t.predicted_per_second),
         r.first_token_s !== undefined && r.first_token_s !== null ? `${fmtNumber(r.first_token_s, 2)} s` : "–"];
    cells.push(r.duration_s !== undefined ? `${fmtNumber(r.duration_s, 2)} s` : "");
    cells.forEach((c, i) => {
      const td = el("td", "", c);
      if (r.finish === "rejected" && i === 3) { td.colSpan = 5; tr.appendChild(td); return; }
      if (r.finish === "rejected" && i > 3 && i < 8) return;
      tr.appendChild(td);
    });
    tbody.appendChild(tr);
  }
}

function cards(m) {
  const l = m.live, t = m.totals, c = m.conversation_cache || {};
  const list = [["state", l.state], ["running", l.processing], ["waiting", l.deferred],
    ["slots busy", `${l.slots_busy ?? "–"} / ${l.slots_total ?? "–"}`], ["requests", t.requests],
    ["rejected", m.rejected_total], ["output tokens", t.output_tokens], ["uptime", fmtDuration(m.uptime_s)]];
  const box = document.getElementById("cards");
  box.textContent = "";
  for (const [k, v] of list) {
    const card = el("div", "card");
    card.append(el("b", "", typeof v === "number" ? fmtNumber(v, 0) : (v ?? "–")), el("span", "", k));
    box.appendChild(card);
  }
  const cache = document.getElementById("cache");
  cache.textContent = "";
  for (const [k, v] of [["cache slots", c.slots], ["prompt tokens reused", c.reused_tokens],
    ["reuse ratio", c.reuse_ratio === null || c.reuse_ratio === undefined ? "–" : `${(100 * c.reuse_ratio).toFixed(1)} %`],
    ["hits / lookups", `${c.hits ?? 0} / ${c.lookups ?? 0}`]]) {
    const card = el("div", "card");
    card.append(el("b", "", typeof v === "number" ? fmtNumber(v, 0) : (v ?? "–")), el("span", "", k));
    cache.appendChild(card);
  }
}

function monitorPage() {
  nav("Monitor");
  const box = document.getElementById("charts");
  for (const [id, title, series] of CHARTS) box.appendChild(chartCard(id, title, series));
  async function tick() {
    try {
      const r = await apiFetch("/metrics", { headers: { Accept: "application/json" } });
      if (r.status === 401) throw new Error("this server needs an API key: set it in the Chat page's Settings");
      const m = await r.json();
      const hist = m.history || { t: [], series: {} };
      const latest = {};
      for (const [k, v] of Object.entries(hist.series)) latest[k] = v[v.length - 1];
      for (const [id, , series, fmt, fixedMax] of CHARTS) {
        const card = document.getElementById(`chart-${id}`);
        const present = series.some(([key]) => (hist.series[key] || []).some(v => v !== null && v !== undefined));
        card.hidden = id.startsWith("gpu") && !present;   // GPU charts only where a GPU is read
        if (!card.hidden) drawChart(card, hist, series, fmt, fixedMax, latest);
      }
      cards(m);
      requestRows(m);
      document.getElementById("status").textContent = "";
    } catch (err) {
      document.getElementById("status").textContent = err.message.includes("API key") ? err.message : "server unreachable";
    }
  }
  tick();
  setInterval(tick, 1000);
}
