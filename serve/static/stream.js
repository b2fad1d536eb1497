// Strata web app: the stream parser. Turns the bytes of an OpenAI chat-completions SSE stream into one
// reply object (content, reasoning, tool calls, usage, timings, error, finish), whatever way the network
// cut the bytes. No DOM; runs in the browser and under node (tests/serve/scenarios/test_web_js.py).
"use strict";

// SSE framing: events end with a blank line (LF or CRLF); only `data:` fields matter here. Comment lines
// (": ping") and other fields are skipped. feed() returns the data payloads completed by this chunk.
class SSEParser {
  constructor() { this.buf = ""; this.data = []; }

  feed(text) {
    this.buf += text;
    const out = [];
    let nl;
    while ((nl = this.buf.indexOf("\n")) >= 0) {
      let line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (this.data.length) out.push(this.data.join("\n"));
        this.data = [];
      } else if (line.startsWith("data:")) {
        this.data.push(line.slice(line[5] === " " ? 6 : 5));
      }
    }
    return out;
  }

  end() {  // a stream cut without its final blank line still delivers its last event
    const out = this.feed("\n\n");
    this.buf = "";
    return out;
  }
}

// One reply being built from chat.completion.chunk objects.
class ChatReply {
  constructor() {
    this.content = "";
    this.reasoning = "";
    this.toolCalls = [];     // [{id, name, arguments}] in index order
    this.usage = null;
    this.timings = null;
    this.finish = null;
    this.error = null;
    this.done = false;       // [DONE] seen
    this.firstAt = null;     // ms clock of the first content or reasoning piece
  }

  // payload: one SSE data string; returns true when it changed what is shown.
  apply(payload, nowMs) {
    if (payload === "[DONE]") { this.done = true; return false; }
    let ev;
    try { ev = JSON.parse(payload); } catch (e) { this.error = "the server sent a malformed event"; return true; }
    if (ev.error) {
      this.error = (ev.error && ev.error.message) || String(ev.error);
      return true;
    }
    if (ev.usage) this.usage = ev.usage;
    if (ev.timings) this.timings = ev.timings;
    const choice = ev.choices && ev.choices[0];
    if (!choice) return !!ev.usage;
    if (choice.finish_reason) this.finish = choice.finish_reason;
    const d = choice.delta || {};
    let changed = false;
    const reasoning = d.reasoning_content || d.reasoning;
    if (reasoning) { this.reasoning += reasoning; changed = true; }
    if (d.content) { this.content += d.content; changed = true; }
    for (const tc of d.tool_calls || []) {
      const i = tc.index !== undefined ? tc.index : this.toolCalls.length;
      const call = this.toolCalls[i] || (this.toolCalls[i] = { id: "", name: "", arguments: "" });
      if (tc.id) call.id = tc.id;
      if (tc.function && tc.function.name) call.name += tc.function.name;
      if (tc.function && tc.function.arguments) call.arguments += tc.function.arguments;
      changed = true;
    }
    if (changed && this.firstAt === null && nowMs !== undefined) this.firstAt = nowMs;
    return changed;
  }
}

// The line under an answer: prompt and output tokens, cached tokens, decode speed, time to first token.
function replyFigures(usage, timings, ttftMs) {
  if (!usage) return "";
  const parts = [`${usage.prompt_tokens} prompt`];
  const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
  if (cached) parts[0] += ` (${cached} cached)`;
  parts.push(`${usage.completion_tokens} tokens`);
  const rs = usage.completion_tokens_details && usage.completion_tokens_details.reasoning_tokens;
  if (rs) parts.push(`${rs} thinking`);
  if (timings && timings.predicted_per_second) parts.push(`${timings.predicted_per_second.toFixed(1)} tok/s`);
  if (ttftMs !== null && ttftMs !== undefined) parts.push(`first token ${(ttftMs / 1000).toFixed(2)} s`);
  return parts.join(" · ");
}

if (typeof module !== "undefined") module.exports = { SSEParser, ChatReply, replyFigures };
