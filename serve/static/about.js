// Strata web app: the About page. Everything comes from GET /about.json: the model card, the engine's build
// and kernels, the machine, and every route the server answers with its dialect (read from the server's
// route tables, so routes added later appear by themselves), plus the uptime.
"use strict";

function factRows(table, rows) {
  table.textContent = "";
  for (const [k, v] of rows) {
    if (v === null || v === undefined || v === "") continue;
    const tr = el("tr");
    tr.append(el("th", "", k), el("td", "", String(v)));
    table.appendChild(tr);
  }
}

async function aboutPage() {
  nav("About");
  let a;
  try {
    const r = await apiFetch("/about.json");
    if (r.status === 401) throw new Error("this server needs an API key: set it in the Chat page's Settings");
    a = await r.json();
  } catch (e) {
    document.getElementById("status").textContent = e.message.includes("API key") ? e.message : "server unreachable";
    return;
  }
  const m = a.model, e = a.engine, h = a.machine;
  factRows(document.getElementById("model-card"), [
    ["name", m.name], ["architecture", m.architecture], ["quantisation", m.quant], ["file", m.file],
    ["file size", m.file_bytes ? fmtBytes(m.file_bytes) : null], ["context", m.context],
    ["trained context", m.context_trained], ["layers", m.n_layer], ["embedding", m.n_embd], ["vocabulary", m.n_vocab],
    ["weights in memory", m.weights_mib !== undefined && m.weights_mib !== null ? `${m.weights_mib} MiB` : null],
    ["chat template", m.template_family + (m.template_thinking ? " (thinking)" : "")]]);
  factRows(document.getElementById("engine"), [
    ["engine", e.engine], ["loaded", e.loaded ? "yes" : "no"], ["backend", e.backend], ["kernels", e.kernels],
    ["threads", e.threads], ["KV cache", e.kv], ["prompt chunk", e.chunk], ["decode slots", e.batch_slots || "1"],
    ["engines", e.engines], ["conversation cache slots", e.conversation_cache_slots]]);
  factRows(document.getElementById("machine"), [
    ["system", h.os], ["CPU", h.cpu], ["logical cores", h.cores_logical],
    ["RAM", h.ram_total ? fmtBytes(h.ram_total) : null], ["GPUs", (h.gpus || []).join(", ") || "none read"],
    ["Python", h.python], ["uptime", fmtDuration(a.uptime_s)]]);
  const tbody = document.getElementById("routes");
  tbody.textContent = "";
  for (const r of a.routes) {
    const tr = el("tr");
    tr.append(el("td", "route-method", r.method), el("td"), el("td", "", r.dialect), el("td", "muted", r.what));
    tr.children[1].appendChild(el("code", "", r.path));
    tbody.appendChild(tr);
  }
}
