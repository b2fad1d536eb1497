// Strata web app: shared header, the streaming chat (Chat page) and the live figures (Monitor page).
// Talks only to this server's own API: /v1/chat/completions (SSE), /metrics, /v1/status, /health.
"use strict";

function nav(active) {
  const pages = [["/", "Chat"], ["/monitor", "Monitor"], ["/about", "About"]];
  const el = document.querySelector("nav");
  el.innerHTML = pages.map(([href, name]) =>
    `<a href="${href}" class="${name === active ? "on" : ""}">${name}</a>`).join("") +
    `<span class="model" id="model">…</span>`;
  fetch("/health").then(r => r.json()).then(h => {
    document.getElementById("model").textContent =
      `${h.model} · ${h.loaded ? "ready" : h.status} · context ${h.max_context}`;
  }).catch(() => { document.getElementById("model").textContent = "server unreachable"; });
}

function add(cls, text) {
  const div = document.createElement("div");
  div.className = "msg " + cls;
  div.textContent = text;
  document.getElementById("log").appendChild(div);
  return div;
}

async function chatPage() {
  nav("Chat");
  const history = [];
  const form = document.getElementById("ask"), input = document.getElementById("text");
  const stopButton = document.getElementById("stop");
  let controller = null;
  stopButton.onclick = () => controller && controller.abort();
  document.getElementById("clear").onclick = () => { history.length = 0; document.getElementById("log").innerHTML = ""; };
  input.addEventListener("keydown", e => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); } });
  form.onsubmit = async e => {
    e.preventDefault();
    const text = input.value.trim();
    if (!text || controller) return;
    input.value = "";
    history.push({ role: "user", content: text });
    add("user", text);
    const out = add("assistant", "");
    const figures = document.createElement("div");
    figures.className = "figures";
    controller = new AbortController();
    let answer = "";
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" }, signal: controller.signal,
        body: JSON.stringify({ messages: history, stream: true, stream_options: { include_usage: true } }),
      });
      if (!r.ok) { const err = await r.json(); throw new Error(err.error ? err.error.message : r.statusText); }
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
          if (!block.startsWith("data: ") || block === "data: [DONE]") continue;
          const ev = JSON.parse(block.slice(6));
          if (ev.error) throw new Error(ev.error.message);
          const delta = ev.choices && ev.choices[0] && ev.choices[0].delta;
          if (delta && delta.content) { answer += delta.content; out.textContent = answer; }
          if (ev.usage && ev.timings) {
            const t = ev.timings;
            figures.textContent = `${ev.usage.prompt_tokens} prompt tokens (${ev.usage.prompt_tokens_details.cached_tokens} cached) · ` +
              `${ev.usage.completion_tokens} tokens · ${(t.predicted_per_second || 0).toFixed(1)} tok/s`;
          }
        }
      }
    } catch (err) {
      if (err.name !== "AbortError") { const p = document.createElement("div"); p.className = "error"; p.textContent = err.message; out.appendChild(p); }
    }
    out.appendChild(figures);
    history.push({ role: "assistant", content: answer });
    controller = null;
  };
}

async function monitorPage() {
  nav("Monitor");
  const fmt = v => (v === null || v === undefined) ? "–" : (typeof v === "number" ? (Math.round(v * 10) / 10) : v);
  async function tick() {
    try {
      const m = await (await fetch("/metrics")).json();
      const l = m.live, t = m.totals;
      const cards = [["state", l.state], ["queued", l.queued], ["tok/s now", l.tok_s], ["prefill tok/s", l.prefill_tok_s_mean],
        ["requests", t.requests], ["prompt tokens", t.prompt_tokens], ["reused", t.reused], ["output tokens", t.output_tokens],
        ["cpu %", m.hardware && m.hardware.cpu], ["context", m.engine.max_context]];
      document.getElementById("cards").innerHTML = cards.map(([k, v]) => `<div class="card"><b>${fmt(v)}</b><span>${k}</span></div>`).join("");
      document.getElementById("rows").innerHTML = m.requests.map(r => {
        const t = r.timings || {};
        return `<tr><td>${new Date(r.time * 1000).toLocaleTimeString()}</td><td>${r.finish || ""}</td><td>${r.prompt_tokens}</td>` +
          `<td>${t.cache_n ?? "–"}</td><td>${r.output_tokens ?? "–"}</td><td>${fmt(t.prompt_per_second)}</td>` +
          `<td>${fmt(t.predicted_per_second)}</td><td>${fmt(r.duration_s)}</td></tr>`;
      }).join("");
    } catch (err) { document.getElementById("cards").textContent = "server unreachable"; }
  }
  tick();
  setInterval(tick, 1000);
}

async function aboutPage() {
  nav("About");
  const s = await (await fetch("/v1/status")).json();
  document.getElementById("facts").innerHTML = [["model", s.model], ["engine", s.engine], ["loaded", s.loaded],
    ["context", s.context.max_positions], ["trained context", s.context.native], ["uptime", s.uptime_s + " s"],
    ["APIs", s.dialects.join(", ")]].map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`).join("");
}
