// Strata web app: tools from MCP servers. The user adds servers by URL in Settings; this browser speaks MCP's
// streamable HTTP transport to each one directly (JSON-RPC 2.0 by POST; an answer comes as JSON or as an SSE
// stream; the session travels in the Mcp-Session-Id header): initialize, notifications/initialized,
// tools/list, tools/call. A server that refuses that POST (404/405: an older server) is spoken to over the
// HTTP+SSE transport instead (GET opens an event stream whose `endpoint` event names where to POST; the
// answers come back on the stream). chat.js offers the tools to the model as OpenAI tools and asks the user before each
// call (Approve / Deny / Always allow, per server and tool).
// Strata does not proxy: the MCP server must answer this page's origin (CORS, with Mcp-Session-Id exposed), as
// the MCP SDKs' own browser examples configure it. Server URLs and "always allow" choices live in this browser.
"use strict";

const MCP_SERVERS_KEY = "strata.mcp.servers.v1";   // [url, ...]
const MCP_ALLOW_KEY = "strata.mcp.allow.v1";       // ["<url> <tool>", ...]: calls that run without asking
const MCP_PROTOCOL_VERSION = "2025-06-18";
const MCP_TIMEOUT_MS = 30000;     // one JSON-RPC exchange; a server or tool slower than this is reported failed
const MCP_MAX_TOOLS = 256;        // per server: a tools/list that pages on past this is cut here
const MCP_RESULT_CHARS = 20000;   // a tool's text result is cut here before it goes to the model

// One connection to one MCP server (streamable HTTP).
class McpClient {
  constructor(url) {
    this.url = url;
    this.session = null;          // Mcp-Session-Id, once the server gave one
    this.version = MCP_PROTOCOL_VERSION;
    this.nextId = 1;
    this.tools = [];
    this.error = null;
    this.sse = null;              // the HTTP+SSE transport, when the server speaks only that
  }

  async connect() {
    const params = { protocolVersion: MCP_PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: "strata-web", version: "1" } };
    let init;
    try {
      init = await this.rpc("initialize", params);
    } catch (e) {
      if (![404, 405].includes(e.status)) throw e;
      this.sse = new McpSseTransport(this.url);
      init = await this.rpc("initialize", params);
    }
    this.version = init.protocolVersion || MCP_PROTOCOL_VERSION;
    await this.send({ jsonrpc: "2.0", method: "notifications/initialized" });
    const tools = [];
    let cursor = null;
    do {
      const page = await this.rpc("tools/list", cursor ? { cursor } : {});
      tools.push(...(page.tools || []));
      cursor = page.nextCursor;
    } while (cursor && tools.length < MCP_MAX_TOOLS);
    this.tools = tools.slice(0, MCP_MAX_TOOLS);
    return this.tools;
  }

  call(name, args) { return this.rpc("tools/call", { name, arguments: args }); }

  close() { if (this.sse) this.sse.close(); }

  // POST one message; returns the Response (the caller reads it). Keeps the session id the server sends.
  async send(message, signal) {
    if (this.sse) return this.sse.post(message, signal);
    const headers = { "Content-Type": "application/json", Accept: "application/json, text/event-stream" };
    if (this.session) headers["Mcp-Session-Id"] = this.session;
    if (message.method !== "initialize") headers["MCP-Protocol-Version"] = this.version;
    let r;
    try {
      r = await fetch(this.url, { method: "POST", headers, body: JSON.stringify(message), signal });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new Error(`cannot reach ${this.url} (is it running, and does it allow this page's origin by CORS?)`);
    }
    const sid = r.headers.get("Mcp-Session-Id");
    if (sid) this.session = sid;
    if (!r.ok) {
      let text = "";
      try { text = (await r.text()).slice(0, 300); } catch (e) { /* the status says enough */ }
      throw Object.assign(new Error(`${this.url} answered ${r.status}${text ? `: ${text}` : ""}`), { status: r.status });
    }
    return r;
  }

  async rpc(method, params) {
    const id = this.nextId++;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), MCP_TIMEOUT_MS);
    try {
      const answer = this.sse ? this.sse.answer(id, ctl.signal) : null;   // listening before the POST
      const r = await this.send({ jsonrpc: "2.0", id, method, params }, ctl.signal);
      const msg = answer ? await answer : await readAnswer(r, id);
      if (msg.error) throw new Error(`${method}: ${msg.error.message || JSON.stringify(msg.error)}`);
      return msg.result || {};
    } catch (e) {
      if (e.name === "AbortError") throw new Error(`${method}: no answer in ${MCP_TIMEOUT_MS / 1000} s`);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }
}

// The JSON-RPC answer with this id, from a JSON body (one message or a batch) or an SSE stream (read up to it).
async function readAnswer(r, id) {
  const type = r.headers.get("Content-Type") || "";
  const pick = m => m && m.id === id && (m.result !== undefined || m.error !== undefined);
  if (!type.includes("text/event-stream")) {
    const body = await r.json();
    const found = (Array.isArray(body) ? body : [body]).find(pick);
    if (!found) throw new Error("the MCP server's answer carries no reply to this request");
    return found;
  }
  const reader = r.body.getReader(), dec = new TextDecoder(), sse = new SSEParser();
  for (;;) {
    const { value, done } = await reader.read();
    for (const data of done ? sse.end() : sse.feed(dec.decode(value, { stream: true }))) {
      let m;
      try { m = JSON.parse(data); } catch (e) { continue; }   // not JSON-RPC: not ours
      if (pick(m)) { reader.cancel().catch(() => {}); return m; }
    }
    if (done) throw new Error("the MCP server ended its stream before answering");
  }
}

// MCP's HTTP+SSE transport: one long GET stream carries the `endpoint` event, then every answer.
class McpSseTransport {
  constructor(url) {
    this.url = url;
    this.waiting = new Map();     // JSON-RPC id -> resolve, for the requests whose answer has not come
    this.controller = new AbortController();
    this.failure = null;
    this.endpoint = new Promise((resolve, reject) => { this.gotEndpoint = resolve; this.noEndpoint = reject; });
    this.endpoint.catch(() => {});
    this.listen().catch(e => this.fail(e.name === "AbortError" ? "closed" : e.message || String(e)));
  }

  async listen() {
    let r;
    try { r = await fetch(this.url, { headers: { Accept: "text/event-stream" }, signal: this.controller.signal }); }
    catch (e) {
      if (e.name === "AbortError") throw e;
      throw new Error(`cannot reach ${this.url} (is it running, and does it allow this page's origin by CORS?)`);
    }
    if (!r.ok) throw new Error(`${this.url} answered ${r.status}`);
    const reader = r.body.getReader(), dec = new TextDecoder(), sse = new NamedSSEParser();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the MCP server closed its event stream");
      for (const { event, data } of sse.feed(dec.decode(value, { stream: true }))) {
        if (event === "endpoint") { this.gotEndpoint(new URL(data, this.url).href); continue; }
        let m;
        try { m = JSON.parse(data); } catch (e) { continue; }
        const resolve = m && this.waiting.get(m.id);
        if (resolve && (m.result !== undefined || m.error !== undefined)) { this.waiting.delete(m.id); resolve(m); }
      }
    }
  }

  fail(reason) {
    this.failure = reason;
    this.noEndpoint(new Error(reason));
    for (const resolve of this.waiting.values()) resolve({ error: { message: reason } });
    this.waiting.clear();
  }

  answer(id, signal) {
    return new Promise((resolve, reject) => {
      if (this.failure) { resolve({ error: { message: this.failure } }); return; }
      this.waiting.set(id, resolve);
      signal.addEventListener("abort", () => { this.waiting.delete(id); reject(signal.reason || new DOMException("", "AbortError")); });
    });
  }

  async post(message, signal) {
    const endpoint = await this.endpoint;
    const r = await fetch(endpoint, { method: "POST", headers: { "Content-Type": "application/json" },
                                      body: JSON.stringify(message), signal });
    if (!r.ok) throw new Error(`${endpoint} answered ${r.status}`);
    return r;
  }

  close() { this.controller.abort(); }
}

// SSE framing with the event name kept (stream.js's SSEParser keeps only the data).
class NamedSSEParser {
  constructor() { this.buf = ""; this.event = "message"; this.data = []; }

  feed(text) {
    this.buf += text;
    const out = [];
    let nl;
    while ((nl = this.buf.indexOf("\n")) >= 0) {
      const line = this.buf.slice(0, nl).replace(/\r$/, "");
      this.buf = this.buf.slice(nl + 1);
      if (line === "") {
        if (this.data.length) out.push({ event: this.event, data: this.data.join("\n") });
        this.event = "message";
        this.data = [];
      } else if (line.startsWith("event:")) {
        this.event = line.slice(6).trim();
      } else if (line.startsWith("data:")) {
        this.data.push(line.slice(line[5] === " " ? 6 : 5));
      }
    }
    return out;
  }
}

// ------------------------------------------------------------------------------------------ the servers
const mcp = { clients: [], ready: null };

function mcpUrls() {
  try { const v = JSON.parse(localStorage.getItem(MCP_SERVERS_KEY) || "[]"); return Array.isArray(v) ? v : []; }
  catch (e) { return []; }
}

// (Re)connects every configured server; resolves when each has connected or failed (its error kept).
function mcpConnectAll() {
  for (const c of mcp.clients) c.close();
  mcp.clients = mcpUrls().map(url => new McpClient(url));
  mcp.ready = Promise.all(mcp.clients.map(c => c.connect().catch(e => { c.error = e.message || String(e); })));
  return mcp.ready;
}

function mcpAddServer(url) {
  const parsed = new URL(url);          // throws on a malformed URL: the caller shows it
  if (!/^https?:$/.test(parsed.protocol)) throw new Error("an MCP server URL starts with http:// or https://");
  const urls = mcpUrls().filter(u => u !== parsed.href);
  localStorage.setItem(MCP_SERVERS_KEY, JSON.stringify([...urls, parsed.href]));
  return mcpConnectAll();
}

function mcpRemoveServer(url) {
  localStorage.setItem(MCP_SERVERS_KEY, JSON.stringify(mcpUrls().filter(u => u !== url)));
  return mcpConnectAll();
}

// name -> {client, tool}; the first server that offers a name keeps it.
function mcpToolMap() {
  const map = new Map();
  for (const c of mcp.clients) for (const t of c.error ? [] : c.tools) if (!map.has(t.name)) map.set(t.name, { client: c, tool: t });
  return map;
}

// The tools for /v1/chat/completions (OpenAI's function shape), or [] with no servers.
function mcpOpenAITools() {
  return [...mcpToolMap().values()].map(({ tool }) => ({ type: "function", function: {
    name: tool.name, description: tool.description || "",
    parameters: tool.inputSchema || { type: "object", properties: {} } } }));
}

function allowKey(name) {
  const hit = mcpToolMap().get(name);
  return hit ? `${hit.client.url} ${name}` : null;
}

function mcpAllowed(name) {
  const key = allowKey(name);
  try { return key !== null && JSON.parse(localStorage.getItem(MCP_ALLOW_KEY) || "[]").includes(key); }
  catch (e) { return false; }
}

function mcpAllowAlways(name) {
  const key = allowKey(name);
  if (key === null) return;
  let keys = [];
  try { keys = JSON.parse(localStorage.getItem(MCP_ALLOW_KEY) || "[]"); } catch (e) { /* starts over */ }
  if (!keys.includes(key)) localStorage.setItem(MCP_ALLOW_KEY, JSON.stringify([...keys, key]));
}

// Runs one approved call: {text, error} where text is what goes back to the model (an error's text too).
async function mcpRunTool(name, argsText) {
  await mcp.ready;
  const hit = mcpToolMap().get(name);
  if (!hit) return { text: `Error: no connected MCP server offers a tool named ${name}`, error: true };
  let args;
  try { args = argsText ? JSON.parse(argsText) : {}; }
  catch (e) { return { text: `Error: the arguments are not valid JSON: ${argsText}`, error: true }; }
  try {
    const res = await hit.client.call(name, args);
    const parts = (res.content || []).map(c => (c.type === "text" ? c.text : `[${c.type} content]`));
    let text = parts.join("\n");
    if (!text && res.structuredContent !== undefined) text = JSON.stringify(res.structuredContent);
    text = text.slice(0, MCP_RESULT_CHARS);
    return res.isError ? { text: `Error: ${text || "the tool failed"}`, error: true } : { text, error: false };
  } catch (e) {
    return { text: `Error: ${e.message || e}`, error: true };
  }
}

// ------------------------------------------------------------------------------------------ the views
// The Settings block: each server with its state (tools or error) and a Remove button.
function renderMcpList() {
  const ul = document.getElementById("mcp-list");
  ul.textContent = "";
  for (const c of mcp.clients) {
    const li = el("li", c.error ? "error" : "");
    const state = c.error ? c.error : c.tools.length ? `tools: ${c.tools.map(t => t.name).join(", ")}` : "connecting…";
    li.append(el("code", "", c.url), el("span", "muted", ` ${state} `));
    const rm = actionButton("Remove", "mcp-remove", "Forget this MCP server");
    rm.onclick = async () => { await mcpRemoveServer(c.url); renderMcpList(); };
    li.appendChild(rm);
    ul.appendChild(li);
  }
}

async function onMcpAdd() {
  const input = document.getElementById("mcp-url");
  const errEl = document.getElementById("mcp-error");
  errEl.textContent = "";
  const url = input.value.trim();
  if (!url) return;
  let ready;
  try { ready = mcpAddServer(url); } catch (e) { errEl.textContent = e.message || String(e); return; }
  input.value = "";
  renderMcpList();
  await ready;
  renderMcpList();
}

const TOOL_STATUS = { pending: "waiting for your approval", running: "running…", done: "done",
                      error: "failed", denied: "denied" };

// A tool message: the call's name and arguments, its state, the buttons while it waits, then its result.
function fillToolMessage(div, m) {
  div.appendChild(el("div", "tool-name", `MCP tool: ${m.name} · ${TOOL_STATUS[m.status] || m.status}`));
  let args = m.arguments || "";
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* shown as it came */ }
  div.appendChild(el("pre", "args", args));
  if (m.status === "pending") {
    const row = el("div", "approve");
    const approve = actionButton("Approve", "approve", "Run this call once");
    approve.className = "small";          // the one filled button: the answer the user is asked for
    row.append(approve,
               actionButton("Deny", "deny", "Do not run it; the model is told so"),
               actionButton(`Always allow ${m.name}`, "always", "Run this tool from now on without asking"));
    div.appendChild(row);
  } else if (m.status !== "running") {
    div.appendChild(el("pre", m.status === "error" ? "result error" : "result", m.content || ""));
  }
}

if (typeof module !== "undefined") module.exports = { NamedSSEParser, readAnswer };
