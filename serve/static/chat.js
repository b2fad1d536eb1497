// Strata web app: the Chat page. Conversations live in this browser (localStorage); answers stream from
// /v1/chat/completions (SSE, parsed by stream.js) and render through markdown.js. Shared sampling defaults
// are the server's GET/POST /settings; the system prompt and the model are per conversation.
// A turn that fails (an error before or during the answer) stays on screen with its error, marked failed,
// and is left out of the history later questions send, so one context overflow never breaks the chat.
// With MCP servers set (mcp.js), their tools go with each request; a call the model makes becomes a tool
// message that waits for the user's Approve / Deny, runs, and the answer continues from its result.
"use strict";

const STORE_KEY = "strata.chats.v1";
const CURRENT_KEY = "strata.current";
const PIN_SLACK_PX = 48;        // within this distance of the bottom the view follows the stream
const MAX_AUTO_TOOL_ROUNDS = 8; // tool rounds one question may take before "always allow" asks again
const SETTINGS_FIELDS = [       // the /settings defaults the panel edits: [key, kind]
  ["temperature", "float"], ["top_p", "float"], ["top_k", "int"], ["max_tokens", "int"], ["seed", "int"],
  ["reasoning_effort", "text"], ["reasoning_budget_tokens", "int"]];

const state = { store: null, chat: null, controller: null, stick: true, models: [] };

// ------------------------------------------------------------------------------------------ storage
function loadStore() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE_KEY) || "null");
    if (s && s.chats && Array.isArray(s.order)) {
      for (const c of Object.values(s.chats)) {   // a tool call cut by a reload waits for the user again
        for (const m of c.messages || []) if (m.role === "tool" && m.status === "running") m.status = "pending";
      }
      return s;
    }
  } catch (e) { /* a damaged store starts over */ }
  return { chats: {}, order: [] };
}

function saveStore() {
  const keep = (k, v) => (k === "showReasoning" || k === "pending" ? undefined : v);
  try { localStorage.setItem(STORE_KEY, JSON.stringify(state.store, keep)); }
  catch (e) { showNotice("this browser's storage is full: delete or export old conversations"); }
}

function newChat() {
  const id = `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;
  const chat = { id, title: "New chat", created: Date.now(), updated: Date.now(), system: "", model: "", messages: [] };
  state.store.chats[id] = chat;
  state.store.order.unshift(id);
  openChat(id);
  return chat;
}

function openChat(id) {
  state.chat = state.store.chats[id];
  document.body.classList.remove("list-open");
  localStorage.setItem(CURRENT_KEY, id);
  saveStore();
  renderList();
  renderChat();
}

function touch(chat) {
  chat.updated = Date.now();
  state.store.order = [chat.id, ...state.store.order.filter(x => x !== chat.id)];
  saveStore();
}

// ------------------------------------------------------------------------------------------ the list
function renderList() {
  const ul = document.getElementById("chats");
  ul.textContent = "";
  for (const id of state.store.order) {
    const c = state.store.chats[id];
    const li = el("li", c === state.chat ? "on" : "");
    const name = el("button", "name", c.title);
    name.type = "button";
    name.onclick = () => { if (!state.controller) openChat(id); };
    const ren = el("button", "ghost small", "✎");
    ren.type = "button"; ren.title = "Rename"; ren.dataset.act = "rename";
    ren.onclick = () => {
      const t = prompt("Name of this conversation", c.title);
      if (t !== null && t.trim()) { c.title = t.trim().slice(0, 120); saveStore(); renderList(); }
    };
    const exp = el("button", "ghost small", "⤓");
    exp.type = "button"; exp.title = "Export as JSON"; exp.dataset.act = "export";
    exp.onclick = () => exportChat(c);
    const del = el("button", "ghost small", "✕");
    del.type = "button"; del.title = "Delete"; del.dataset.act = "delete";
    del.onclick = () => {
      if (state.controller || !confirm(`Delete "${c.title}"?`)) return;
      delete state.store.chats[id];
      state.store.order = state.store.order.filter(x => x !== id);
      saveStore();
      if (state.chat === c) (state.store.order.length ? openChat(state.store.order[0]) : newChat());
      else renderList();
    };
    li.append(name, ren, exp, del);
    ul.appendChild(li);
  }
}

function exportChat(c) {
  const blob = new Blob([JSON.stringify(c, null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `${c.title.replace(/[^\w.-]+/g, "_").slice(0, 60) || "chat"}.json`;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ------------------------------------------------------------------------------------------ messages
function renderChat() {
  const log = document.getElementById("log");
  log.textContent = "";
  state.chat.messages.forEach((m, i) => log.appendChild(messageView(m, i)));
  document.getElementById("empty").hidden = state.chat.messages.length > 0;
  document.getElementById("system-note").textContent = state.chat.system ? `System: ${state.chat.system}` : "";
  log.scrollTop = log.scrollHeight;
  state.stick = true;
}

function actionButton(label, act, title) {
  const b = el("button", "ghost small", label);
  b.type = "button";
  b.dataset.act = act;
  if (title) b.title = title;
  return b;
}

function messageView(m, i, live = false) {
  const div = el("div", `msg ${m.role}${m.failed ? " failed" : ""}${m.role === "tool" ? ` ${m.status}` : ""}`);
  div.dataset.i = i;
  fillMessage(div, m, live);
  return div;
}

// (Re)draws one message into its element; `live` while its answer streams.
function fillMessage(div, m, live) {
  div.textContent = "";
  if (m.role === "tool") { fillToolMessage(div, m); return; }
  if (m.role === "user") {
    div.appendChild(el("div", "text", m.content));
  } else {
    if (m.reasoning) {
      const d = el("details", "reasoning");
      // open while only thinking streams, closed once the answer comes, unless the reader chose (kept while
      // the message is redrawn; not saved)
      d.open = m.showReasoning !== undefined ? m.showReasoning : live && !m.content;
      const summary = el("summary", "", live && !m.content ? "Thinking…" : "Thinking");
      summary.addEventListener("click", () => { m.showReasoning = !d.open; });   // before the toggle
      d.appendChild(summary);
      const body = el("div", "md");
      body.innerHTML = renderMarkdown(m.reasoning);
      d.appendChild(body);
      div.appendChild(d);
    }
    const body = el("div", "md body");
    body.innerHTML = renderMarkdown(m.content || "");
    div.appendChild(body);
    for (const call of m.toolCalls || []) {
      const t = el("div", "tool");
      t.appendChild(el("div", "tool-name", `tool call: ${call.name || "?"}`));
      let args = call.arguments || "";
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* shown as it came */ }
      t.appendChild(el("pre", "", args));
      div.appendChild(t);
    }
    if (live && !m.content && !m.reasoning && !(m.toolCalls || []).length) div.appendChild(el("span", "cursor", "▍"));
  }
  if (m.error) div.appendChild(el("div", "error", m.error));
  if (m.failed && m.role === "user") div.appendChild(el("div", "note", "this turn failed: it is left out of what later questions send"));
  if (m.stopped) div.appendChild(el("div", "note", "stopped"));
  if (m.figures) div.appendChild(el("div", "figures", m.figures));
  if (!live) {
    const acts = el("div", "actions");
    acts.appendChild(actionButton("Copy", "copy", "Copy this message"));
    if (m.role === "user") acts.appendChild(actionButton("Edit", "edit", "Edit and send again"));
    else acts.appendChild(actionButton("Regenerate", "regen", "Answer this question again"));
    div.appendChild(acts);
  }
}

function onLogClick(e) {
  const b = e.target.closest("button[data-act]");
  if (!b || state.controller) return;
  const div = b.closest(".msg");
  const i = Number(div.dataset.i);
  const m = state.chat.messages[i];
  if (b.dataset.act === "copy") {
    copyText(m.content || "").then(ok => flash(b, ok ? "Copied" : "Copy failed"));
  } else if (b.dataset.act === "regen") {
    state.chat.messages.splice(i);                 // this answer and everything after it
    const q = state.chat.messages[i - 1];
    if (q) { q.failed = false; q.error = undefined; }
    renderChat();
    ask();
  } else if (b.dataset.act === "edit") {
    editMessage(div, i);
  } else if (["approve", "deny", "always"].includes(b.dataset.act) && m.status === "pending") {
    decideTool(m, b.dataset.act);
  }
}

// ------------------------------------------------------------------------------------------ tool calls
// The tool messages that wait or run at the end of this chat (a turn's calls, in order).
function openToolCalls(chat) {
  const out = [];
  for (let i = chat.messages.length - 1; i >= 0 && chat.messages[i].role === "tool"; i--) {
    if (["pending", "running"].includes(chat.messages[i].status)) out.push(chat.messages[i]);
  }
  return out;
}

// After an answer with tool calls: one tool message per call; the ones "always allowed" run at once, unless
// this is past the MAX_AUTO_TOOL_ROUNDS-th tool round since the question (a model in a loop): then it asks.
function startToolCalls(chat, calls) {
  const msgs = calls.map(c => ({ role: "tool", callId: c.id, name: c.name, arguments: c.arguments, status: "pending" }));
  let rounds = 0;
  for (let i = chat.messages.length - 1; i >= 0 && chat.messages[i].role !== "user"; i--) {
    if (chat.messages[i].role === "assistant" && (chat.messages[i].toolCalls || []).length) rounds++;
  }
  chat.messages.push(...msgs);
  if (rounds > MAX_AUTO_TOOL_ROUNDS) return;
  for (const t of msgs) if (mcpAllowed(t.name)) decideTool(t, "approve");
}

async function decideTool(t, act) {
  const chat = state.chat;
  if (act === "always") mcpAllowAlways(t.name);
  if (act === "deny") {
    Object.assign(t, { status: "denied", content: "The user denied this tool call; it did not run." });
  } else {
    t.status = "running";
    if (state.chat === chat) renderChat();
    const res = await mcpRunTool(t.name, t.arguments);
    Object.assign(t, { status: res.error ? "error" : "done", content: res.text });
  }
  touch(chat);
  if (state.chat === chat) renderChat();
  if (!openToolCalls(chat).length && !state.controller && state.chat === chat) ask();   // the model goes on
}

function editMessage(div, i) {
  const m = state.chat.messages[i];
  div.textContent = "";
  const ta = el("textarea", "edit");
  ta.value = m.content;
  ta.rows = Math.min(12, m.content.split("\n").length + 1);
  const save = el("button", "", "Send");
  save.type = "button";
  const cancel = el("button", "secondary", "Cancel");
  cancel.type = "button";
  cancel.onclick = () => renderChat();
  save.onclick = () => {
    const text = ta.value.trim();
    if (!text) return;
    state.chat.messages.splice(i);
    state.chat.messages.push({ role: "user", content: text });
    renderChat();
    ask();
  };
  const row = el("div", "actions");
  row.append(save, cancel);
  div.append(ta, row);
  ta.focus();
}

// ------------------------------------------------------------------------------------------ asking
function requestMessages(chat) {
  const out = [];
  if (chat.system) out.push({ role: "system", content: chat.system });
  for (const m of chat.messages) {
    if (m.failed || m.pending) continue;            // a failed turn leaves the history
    if (m.role === "user") out.push({ role: "user", content: m.content });
    else if (m.role === "tool") out.push({ role: "tool", tool_call_id: m.callId, content: m.content || "" });
    else if (m.content || (m.toolCalls || []).length) {
      const msg = { role: "assistant", content: m.content || "" };
      if ((m.toolCalls || []).length) {
        msg.tool_calls = m.toolCalls.map(c => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
      }
      out.push(msg);
    }
  }
  return out;
}

function send(text) {
  const chat = state.chat;
  if (chat.messages.length === 0 && chat.title === "New chat") {
    chat.title = text.replace(/\s+/g, " ").slice(0, 48);
    renderList();
  }
  chat.messages.push({ role: "user", content: text });
  renderChat();
  ask();
}

async function ask() {
  const chat = state.chat;
  const body = { messages: requestMessages(chat), stream: true, stream_options: { include_usage: true } };
  if (chat.model) body.model = chat.model;
  const tools = mcpOpenAITools();
  if (tools.length) body.tools = tools;
  const m = { role: "assistant", content: "", pending: true };
  chat.messages.push(m);
  const i = chat.messages.length - 1;
  const log = document.getElementById("log");
  const div = messageView(m, i, true);
  log.appendChild(div);
  document.getElementById("empty").hidden = true;
  state.stick = true;
  setBusy(true);
  const controller = state.controller = new AbortController();
  const reply = new ChatReply();
  const t0 = performance.now();
  let frame = 0;
  const draw = () => {
    frame = 0;
    Object.assign(m, { content: reply.content, reasoning: reply.reasoning, toolCalls: reply.toolCalls });
    fillMessage(div, m, true);
    if (state.stick) log.scrollTop = log.scrollHeight;
  };
  try {
    const r = await apiFetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, signal: controller.signal,
      body: JSON.stringify(body),
    });
    if (!r.ok) {
      let msg = `${r.status} ${r.statusText}`;
      try { const err = await r.json(); msg = (err.error && err.error.message) || msg; } catch (e) { /* keep */ }
      if (r.status === 401) msg += " (this server needs an API key: set it in Settings)";
      throw new Error(msg);
    }
    const reader = r.body.getReader(), dec = new TextDecoder(), sse = new SSEParser();
    for (;;) {
      const { value, done } = await reader.read();
      const payloads = done ? sse.end() : sse.feed(dec.decode(value, { stream: true }));
      for (const p of payloads) {
        if (reply.apply(p, performance.now()) && !frame) frame = requestAnimationFrame(draw);
      }
      if (reply.error) throw new Error(reply.error);
      if (done) break;
    }
  } catch (err) {
    if (err.name === "AbortError") m.stopped = true;
    else { m.error = err.message || String(err); m.failed = true; }
  }
  if (frame) cancelAnimationFrame(frame);
  Object.assign(m, { content: reply.content, reasoning: reply.reasoning, toolCalls: reply.toolCalls });
  delete m.pending;
  const before = chat.messages[i - 1];   // a failed question leaves too; a tool result stays (its call is kept)
  if (m.failed && before && before.role === "user") before.failed = true;
  m.figures = replyFigures(reply.usage, reply.timings, reply.firstAt === null ? null : reply.firstAt - t0);
  state.controller = null;
  setBusy(false);
  touch(chat);
  if (!m.failed && !m.stopped && m.toolCalls.length && tools.length) startToolCalls(chat, m.toolCalls);
  if (state.chat === chat) {
    renderChat();
    if (!state.stick) log.scrollTop = log.scrollHeight;
  }
}

function setBusy(busy) {
  document.getElementById("send").hidden = busy;
  document.getElementById("stop").hidden = !busy;
  document.body.classList.toggle("busy", busy);
}

function showNotice(text) {
  const n = document.getElementById("notice");
  n.textContent = text;
  n.hidden = !text;
}

// ------------------------------------------------------------------------------------------ settings
async function openSettings() {
  const dlg = document.getElementById("settings");
  const f = dlg.querySelector("form");
  document.getElementById("settings-error").textContent = "";
  f.elements.system.value = state.chat.system || "";
  f.elements.api_key.value = localStorage.getItem(API_KEY_KEY) || "";
  try {
    const s = await (await apiFetch("/settings")).json();
    for (const [k] of SETTINGS_FIELDS) f.elements[k].value = s.defaults[k] ?? "";
  } catch (e) {
    document.getElementById("settings-error").textContent = "could not read /settings";
  }
  const pick = f.elements.model;
  pick.textContent = "";
  for (const id of ["", ...state.models]) {
    const o = el("option", "", id || "the server's default");
    o.value = id;
    pick.appendChild(o);
  }
  pick.value = state.chat.model || "";
  renderMcpList();
  document.getElementById("model-row").hidden = state.models.length < 2;
  dlg.showModal();
}

async function saveSettings(e) {
  e.preventDefault();
  const f = e.target;
  const errEl = document.getElementById("settings-error");
  const key = f.elements.api_key.value.trim();
  if (key) localStorage.setItem(API_KEY_KEY, key);
  else localStorage.removeItem(API_KEY_KEY);
  const defaults = {};
  for (const [k, kind] of SETTINGS_FIELDS) {
    const raw = f.elements[k].value.trim();
    if (raw === "") { defaults[k] = null; continue; }
    const v = kind === "text" ? raw : Number(raw);
    if (kind !== "text" && !Number.isFinite(v)) { errEl.textContent = `${k}: a number`; return; }
    defaults[k] = kind === "int" ? Math.trunc(v) : v;
  }
  try {
    const r = await apiFetch("/settings", { method: "POST", headers: { "Content-Type": "application/json" },
                                         body: JSON.stringify({ defaults }) });
    const out = await r.json();
    if (!r.ok) { errEl.textContent = (out.error && out.error.message) || `${r.status}`; return; }
  } catch (err) { errEl.textContent = String(err); return; }
  state.chat.system = f.elements.system.value.trim();
  state.chat.model = f.elements.model.value;
  saveStore();
  renderChat();
  document.getElementById("settings").close();
}

// ------------------------------------------------------------------------------------------ the page
function chatPage() {
  nav("Chat");
  state.store = loadStore();
  const current = localStorage.getItem(CURRENT_KEY);
  if (current && state.store.chats[current]) openChat(current);
  else if (state.store.order.length) openChat(state.store.order[0]);
  else newChat();
  const log = document.getElementById("log");
  log.addEventListener("scroll", () => {
    state.stick = log.scrollHeight - log.scrollTop - log.clientHeight < PIN_SLACK_PX;
  });
  log.addEventListener("click", onLogClick);
  wireCodeCopy(log);
  const form = document.getElementById("ask"), input = document.getElementById("text");
  form.onsubmit = e => {
    e.preventDefault();
    const text = input.value.trim();
    if (!text || state.controller) return;
    if (openToolCalls(state.chat).length) { showNotice("approve or deny the tool call first"); return; }
    showNotice("");
    input.value = "";
    send(text);
  };
  input.addEventListener("keydown", e => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
  });
  document.addEventListener("keydown", e => { if (e.key === "Escape" && state.controller) state.controller.abort(); });
  document.getElementById("stop").onclick = () => state.controller && state.controller.abort();
  document.getElementById("new").onclick = () => { if (!state.controller) newChat(); };
  document.getElementById("open-settings").onclick = openSettings;
  document.getElementById("toggle-list").onclick = () => document.body.classList.toggle("list-open");
  document.getElementById("settings").querySelector("form").onsubmit = saveSettings;
  document.getElementById("settings-cancel").onclick = () => document.getElementById("settings").close();
  document.getElementById("mcp-add").onclick = onMcpAdd;
  mcpConnectAll();
  apiFetch("/v1/models").then(r => r.json()).then(m => { state.models = (m.data || []).map(x => x.id); })
    .catch(() => { state.models = []; });
  setBusy(false);
  input.focus();
}
