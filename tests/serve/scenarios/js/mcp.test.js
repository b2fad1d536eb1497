// Unit tests of serve/static/mcp.js's transport pieces (node --test; run from tests/serve/scenarios/test_web_js.py):
// the SSE framing with event names, and picking a JSON-RPC answer out of a JSON body or an SSE stream.
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const path = require("node:path");
const STATIC = path.join(__dirname, "..", "..", "..", "..", "serve", "static");
global.SSEParser = require(path.join(STATIC, "stream.js")).SSEParser;   // a global in the page
const { NamedSSEParser, readAnswer } = require(path.join(STATIC, "mcp.js"));

const STREAM = "event: endpoint\r\ndata: /messages/?session_id=ab\r\n\r\n: ping\n\n" +
  'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\n\n' +
  'data: {"jsonrpc":"2.0","id":7,\ndata: "result":{"ok":1}}\n\n';

test("event names and multi-line data survive any cut of the bytes", () => {
  for (let cut = 0; cut <= STREAM.length; cut++) {
    const p = new NamedSSEParser();
    const got = [...p.feed(STREAM.slice(0, cut)), ...p.feed(STREAM.slice(cut))];
    assert.deepStrictEqual(got.map(e => e.event), ["endpoint", "message", "message"], `cut at ${cut}`);
    assert.strictEqual(got[0].data, "/messages/?session_id=ab");
    assert.deepStrictEqual(JSON.parse(got[2].data), { jsonrpc: "2.0", id: 7, result: { ok: 1 } });
  }
});

test("the answer with this id, from a JSON batch", async () => {
  const body = [{ jsonrpc: "2.0", id: 3, result: { a: 1 } }, { jsonrpc: "2.0", id: 4, error: { message: "no" } }];
  const r = new Response(JSON.stringify(body), { headers: { "Content-Type": "application/json" } });
  assert.deepStrictEqual((await readAnswer(r, 4)).error, { message: "no" });
  const none = new Response(JSON.stringify(body[0]), { headers: { "Content-Type": "application/json" } });
  await assert.rejects(readAnswer(none, 9), /no reply to this request/);
});

test("the answer with this id, from an SSE stream cut in pieces, after other messages", async () => {
  const text = 'data: {"jsonrpc":"2.0","method":"notifications/message"}\n\n' +
    'data: {"jsonrpc":"2.0","id":1,"result":{"other":true}}\n\n' + "data: not json\n\n" +
    'data: {"jsonrpc":"2.0","id":2,"result":{"tools":[]}}\n\n';
  const bytes = new TextEncoder().encode(text);
  const stream = new ReadableStream({ start(c) { for (let i = 0; i < bytes.length; i += 5) c.enqueue(bytes.slice(i, i + 5)); c.close(); } });
  const r = new Response(stream, { headers: { "Content-Type": "text/event-stream" } });
  assert.deepStrictEqual((await readAnswer(r, 2)).result, { tools: [] });
  const ended = new Response("data: {}\n\n", { headers: { "Content-Type": "text/event-stream" } });
  await assert.rejects(readAnswer(ended, 2), /ended its stream before answering/);
});
