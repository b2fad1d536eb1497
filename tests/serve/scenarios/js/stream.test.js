// Unit tests of serve/static/stream.js (node --test; run from tests/serve/scenarios/test_web_js.py).
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const path = require("node:path");
const { SSEParser, ChatReply, replyFigures } = require(path.join(__dirname, "..", "..", "..", "..", "serve", "static", "stream.js"));

const chunk = delta => JSON.stringify({ choices: [{ index: 0, delta, finish_reason: null }] });
const STREAM = [
  `data: ${chunk({ role: "assistant" })}\n\n`,
  ": ping\n\n",
  `data: ${chunk({ reasoning_content: "Let me think", reasoning: "Let me think" })}\n\n`,
  `data: ${chunk({ content: "Héllo " })}\r\n\r\n`,
  `data: ${chunk({ content: "wörld 🌍" })}\n\n`,
  `data: ${chunk({ tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "get_", arguments: "{\"ci" } }] })}\n\n`,
  `data: ${chunk({ tool_calls: [{ index: 0, function: { name: "weather", arguments: "ty\": \"Paris\"}" } }] })}\n\n`,
  `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] })}\n\n`,
  `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 12, completion_tokens: 7, prompt_tokens_details: { cached_tokens: 4 } }, timings: { predicted_per_second: 42.25 } })}\n\n`,
  "data: [DONE]\n\n",
].join("");

function replay(pieces) {
  const sse = new SSEParser(), reply = new ChatReply();
  for (const p of pieces) for (const d of sse.feed(p)) reply.apply(d, 1);
  for (const d of sse.end()) reply.apply(d, 1);
  return reply;
}

function check(reply) {
  assert.strictEqual(reply.reasoning, "Let me think");          // both field names, counted once
  assert.strictEqual(reply.content, "Héllo wörld 🌍");
  assert.deepStrictEqual(reply.toolCalls, [{ id: "call_1", name: "get_weather", arguments: "{\"city\": \"Paris\"}" }]);
  assert.strictEqual(reply.finish, "tool_calls");
  assert.strictEqual(reply.usage.completion_tokens, 7);
  assert.strictEqual(reply.timings.predicted_per_second, 42.25);
  assert.ok(reply.done);
  assert.strictEqual(reply.error, null);
}

test("one piece", () => check(replay([STREAM])));

test("cut at every position gives the same reply", () => {
  for (let i = 1; i < STREAM.length; i += 3) check(replay([STREAM.slice(0, i), STREAM.slice(i)]));
});

test("one character at a time", () => check(replay(Array.from(STREAM))));

test("a stream cut without its last blank line still delivers the event", () => {
  const sse = new SSEParser();
  assert.deepStrictEqual(sse.feed(`data: ${chunk({ content: "x" })}`), []);
  assert.deepStrictEqual(sse.end(), [chunk({ content: "x" })]);
});

test("multi-line data fields join with a newline; other fields are skipped", () => {
  const sse = new SSEParser();
  assert.deepStrictEqual(sse.feed("event: message\nid: 3\ndata: a\ndata:b\n\n"), ["a\nb"]);
});

test("an error event is the reply's error", () => {
  const reply = new ChatReply();
  reply.apply(chunk({ content: "part" }));
  assert.ok(reply.apply(JSON.stringify({ error: { message: "the engine stopped", type: "server_error" } })));
  assert.strictEqual(reply.error, "the engine stopped");
  assert.strictEqual(reply.content, "part");
  const bad = new ChatReply();
  bad.apply("{not json");
  assert.match(bad.error, /malformed/);
});

test("the first piece's time is kept for the time to first token", () => {
  const reply = new ChatReply();
  reply.apply(chunk({ role: "assistant" }), 5);
  assert.strictEqual(reply.firstAt, null);
  reply.apply(chunk({ content: "a" }), 9);
  reply.apply(chunk({ content: "b" }), 12);
  assert.strictEqual(reply.firstAt, 9);
});

test("figures under an answer", () => {
  assert.strictEqual(replyFigures({ prompt_tokens: 12, completion_tokens: 7, prompt_tokens_details: { cached_tokens: 4 },
    completion_tokens_details: { reasoning_tokens: 3 } }, { predicted_per_second: 42.25 }, 1234),
    "12 prompt (4 cached) · 7 tokens · 3 thinking · 42.3 tok/s · first token 1.23 s");
  assert.strictEqual(replyFigures(null, null, null), "");
});
