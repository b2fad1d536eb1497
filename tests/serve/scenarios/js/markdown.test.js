// Unit tests of serve/static/markdown.js (node --test; run from tests/serve/scenarios/test_web_js.py).
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const path = require("node:path");
const { renderMarkdown } = require(path.join(__dirname, "..", "..", "..", "..", "serve", "static", "markdown.js"));

const TAGS = new Set(["p", "br", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre", "ul", "ol",
  "li", "blockquote", "hr", "table", "thead", "tbody", "tr", "th", "td", "a", "div", "span", "button"]);
const ATTRS = /^(class="[\w #+.-]*"|href="(https?:\/\/|mailto:|\/|#)[^"]*"|target="_blank"|rel="noopener noreferrer"|style="text-align:(left|right|center)"|start="\d+"|type="button"|data-copy="code")$/;

// Every tag in the output is one the renderer writes, with only the attributes it writes.
function assertOnlyOurMarkup(html, input) {
  for (const m of html.matchAll(/<\/?([a-zA-Z0-9]+)((?:\s+[^\s>]+)*)\s*\/?>/g)) {
    assert.ok(TAGS.has(m[1]), `tag <${m[1]}> from ${JSON.stringify(input)}: ${html}`);
    const attrs = m[2].trim() ? m[2].trim().match(/[\w-]+="[^"]*"/g) || [m[2]] : [];
    for (const a of attrs) assert.match(a, ATTRS, `attribute ${a} from ${JSON.stringify(input)}`);
  }
  assert.ok(!/<(?![a-z/])/.test(html.replace(/<\/?[a-z0-9]+(\s[^>]*)?>/g, "")), `a stray < in ${html}`);
}

const HOSTILE = [
  "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[a](javascript:alert(1))", "[a](JaVaScRiPt:alert(1))",
  "[a](data:text/html,<script>alert(1)</script>)", "[a](vbscript:x)", "[a](//evil.example/x)", "`<b>x</b>`",
  "```\n</code></pre><script>x</script>\n```", "\"><svg onload=alert(1)>", "**<i>x</i>**", "_<u>x</u>_",
  "| <b> | c |\n|---|---|\n| <img src=x> | d |", "```\"><img src=x onerror=alert(1)>\ncode\n```",
  "http://a.b/\"onmouseover=\"alert(1)", "[x](http://a.b/\"onclick=\"alert(1))", "\u00000\u0000 and \u00001\u0000",
  "<a href=\"javascript:x\">y</a>", "[**x**](http://a.b/_c_)", "1. <iframe src=x>\n2. ok", "> <style>*{}</style>",
  "# <h1 onclick=x>", "~~<s>~~", "&lt;script&gt;", "<!-- comment -->", "<![CDATA[x]]>",
];

test("hostile strings never become markup", () => {
  for (const s of HOSTILE) {
    const html = renderMarkdown(s);
    assertOnlyOurMarkup(html, s);
    assert.ok(!/<(script|img|svg|iframe|style|i|u|s|b)\b/i.test(html), `${s} -> ${html}`);
    assert.ok(!/href="(javascript|data|vbscript):/i.test(html), `${s} -> ${html}`);
  }
});

test("random strings of markdown and HTML characters keep to our markup", () => {
  let seed = 12345;
  const rand = n => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const pieces = ["<", ">", "\"", "'", "&", "`", "```", "*", "**", "_", "~~", "[", "]", "(", ")", "|", "-", "#", "> ",
    "\n", "\n\n", " ", "a", "1.", "javascript:", "http://x.y/", "on", "=", "script", "img", "\u0000", "\\|", "---"];
  for (let k = 0; k < 2000; k++) {
    let s = "";
    for (let j = rand(40); j >= 0; j--) s += pieces[rand(pieces.length)];
    assertOnlyOurMarkup(renderMarkdown(s), s);
  }
});

test("code blocks: language label, copy button, escaped body, open fence while streaming", () => {
  const html = renderMarkdown("```python\nif a < b:\n    print('x')\n```");
  assert.match(html, /<span class="lang">python<\/span>/);
  assert.match(html, /<button type="button" class="copy" data-copy="code">Copy<\/button>/);
  assert.match(html, /<code class="language-python">if a &lt; b:\n    print\(&#39;x&#39;\)<\/code>/);
  assert.match(renderMarkdown("```js\nlet x = 1;"), /<code class="language-js">let x = 1;<\/code>/);
  assert.match(renderMarkdown("```\nplain\n```"), /<span class="lang">text<\/span>/);
  assert.match(renderMarkdown("~~~\n**not bold**\n~~~"), /<code>\*\*not bold\*\*<\/code>/);
});

test("tables with alignment", () => {
  const html = renderMarkdown("| a | b | c |\n|:--|:-:|--:|\n| 1 | **2** | `3` |");
  assert.match(html, /<th style="text-align:left">a<\/th><th style="text-align:center">b<\/th><th style="text-align:right">c<\/th>/);
  assert.match(html, /<td style="text-align:center"><strong>2<\/strong><\/td><td style="text-align:right"><code>3<\/code><\/td>/);
});

test("lists: bullets, nesting, ordered with a start, a list type change", () => {
  assert.strictEqual(renderMarkdown("- a\n- b"), "<ul><li>a</li><li>b</li></ul>");
  assert.strictEqual(renderMarkdown("- a\n  - b\n- c"), "<ul><li><p>a</p><ul><li>b</li></ul></li><li>c</li></ul>");
  assert.strictEqual(renderMarkdown("3. x\n4. y"), '<ol start="3"><li>x</li><li>y</li></ol>');
  assert.strictEqual(renderMarkdown("- a\n1. b"), "<ul><li>a</li></ul><ol><li>b</li></ol>");
});

test("inline: emphasis, code protects its text, links, bare URLs", () => {
  assert.strictEqual(renderMarkdown("**b** *i* ~~s~~ `*c*`"),
    "<p><strong>b</strong> <em>i</em> <del>s</del> <code>*c*</code></p>");
  assert.strictEqual(renderMarkdown("[x](https://a.b/c?d=1&e=2)"),
    '<p><a href="https://a.b/c?d=1&amp;e=2" target="_blank" rel="noopener noreferrer">x</a></p>');
  assert.strictEqual(renderMarkdown("see https://a.b/x_y_z."),
    '<p>see <a href="https://a.b/x_y_z" target="_blank" rel="noopener noreferrer">https://a.b/x_y_z</a>.</p>');
  assert.strictEqual(renderMarkdown("snake_case_name"), "<p>snake_case_name</p>");
});

test("blocks: headings, quotes, rules, paragraphs with line breaks", () => {
  assert.strictEqual(renderMarkdown("# T\n\n> q\n\n---\n\na\nb"),
    "<h1>T</h1><blockquote><p>q</p></blockquote><hr><p>a<br>b</p>");
});
