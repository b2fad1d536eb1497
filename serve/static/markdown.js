// Strata web app: a small, safe Markdown renderer (no dependencies, runs in the browser and under node).
//
// Contract: renderMarkdown(text) returns HTML in which every character of `text` was escaped before any
// tag was added, and the only tags are the ones this file writes (p, br, h1-h6, strong, em, del, code, pre,
// ul, ol, li, blockquote, hr, table parts, a with an http(s)/mailto href, and the code block's header with
// its copy button). Model output or pasted text can never add an element, an attribute or a script.
// Handles what chat answers use: fenced code blocks (a language label and a copy button; an unclosed fence
// while an answer streams renders as code so far), headings, lists (nested by indentation), block quotes,
// tables with alignment, horizontal rules, inline code, bold, italic, strike-through, links, bare URLs.
"use strict";

const MD_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, c => MD_ESCAPES[c]);
}

// A link target we allow: http(s), mailto, or a path on this server; anything else (javascript:, data:,
// vbscript:, ...) is shown as text. `url` is already escaped.
function safeHref(url) {
  const u = url.trim();
  if (/^(https?:\/\/|mailto:)/i.test(u) || /^\/(?!\/)/.test(u) || /^#/.test(u)) return u;
  return null;
}

// Inline spans over one escaped line. Code spans and links are cut out first (placeholders) so nothing
// inside them is formatted and no tag lands inside an attribute.
function renderInline(escaped) {
  const held = [];
  const hold = html => { held.push(html); return `\u0000${held.length - 1}\u0000`; };
  let s = escaped.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (m, ticks, body) =>
    hold(`<code>${body.trim() === "" ? body : body.replace(/^ (.*) $/, "$1")}</code>`));
  s = s.replace(/\[([^\]\n]+)\]\(([^)\s\u0000]+)\)/g, (m, label, url) => {
    const href = safeHref(url);
    return href ? hold(`<a href="${href}" target="_blank" rel="noopener noreferrer">${label}</a>`) : m;
  });
  s = s.replace(/(^|[\s(])(https?:\/\/[^\s<\u0000]+[^\s<.,;:!?)'"&\u0000])/g,
    (m, pre, url) => pre + hold(`<a href="${url}" target="_blank" rel="noopener noreferrer">${url}</a>`));
  s = s.replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^\w*])\*(?=[^\s*])([^*]*?[^\s*])\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
  for (let k = 0; k < 3 && s.includes("\u0000"); k++) {  // a link label may hold a code span
    s = s.replace(/\u0000(\d+)\u0000/g, (m, i) => held[Number(i)]);
  }
  return s;
}

function codeBlock(lang, lines) {
  const label = (lang.match(/^[\w+#.-]{1,24}/) || [""])[0];
  return `<div class="code"><div class="code-head"><span class="lang">${escapeHtml(label || "text")}</span>` +
    `<button type="button" class="copy" data-copy="code">Copy</button></div>` +
    `<pre><code${label ? ` class="language-${escapeHtml(label)}"` : ""}>${escapeHtml(lines.join("\n"))}</code></pre></div>`;
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map(c => c.trim().replace(/\\\|/g, "|"));
}

const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function table(lines) {
  const head = splitRow(lines[0]);
  const align = splitRow(lines[1]).map(c => c.startsWith(":") && c.endsWith(":") ? "center" :
    c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "");
  const cell = (tag, text, i) =>
    `<${tag}${align[i] ? ` style="text-align:${align[i]}"` : ""}>${renderInline(escapeHtml(text))}</${tag}>`;
  const rows = lines.slice(2).map(l => {
    const cells = splitRow(l);
    return "<tr>" + head.map((_, i) => cell("td", cells[i] || "", i)).join("") + "</tr>";
  });
  return `<div class="table"><table><thead><tr>${head.map((h, i) => cell("th", h, i)).join("")}</tr></thead>` +
    `<tbody>${rows.join("")}</tbody></table></div>`;
}

const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

// Lists: items at deeper indentation than the list's first item nest; a line that is not an item but is
// indented continues the item above.
function list(lines) {
  const items = [];
  const base = LIST_ITEM.exec(lines[0]);
  const indent = base[1].length;
  const ordered = /\d/.test(base[2]);
  for (const line of lines) {
    const m = LIST_ITEM.exec(line);
    if (m && m[1].length <= indent + 1) items.push([m[3]]);
    else items[items.length - 1].push(line.replace(new RegExp(`^\\s{0,${indent + 4}}`), ""));
  }
  const start = ordered ? parseInt(base[2], 10) : 1;
  const body = items.map(([first, ...rest]) => {
    const inner = rest.length ? renderBlocks([first, ...rest]) : renderInline(escapeHtml(first));
    return `<li>${inner}</li>`;
  }).join("");
  return ordered ? `<ol${start !== 1 ? ` start="${start}"` : ""}>${body}</ol>` : `<ul>${body}</ul>`;
}

function blockEnds(line) {
  return /^\s*$/.test(line) || /^\s*(```|~~~)/.test(line) || /^#{1,6}\s/.test(line) || /^\s*>/.test(line) ||
    /^\s*([-*_])(\s*\1){2,}\s*$/.test(line);
}

function renderBlocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (/^\s*$/.test(line)) { i++; continue; }
    if ((m = /^\s*(```+|~~~+)\s*([^`\s]*)[^`]*$/.exec(line))) {
      const fence = m[1], body = [];
      i++;
      while (i < lines.length && !new RegExp(`^\\s*${fence[0] === "`" ? "`" : "~"}{${fence.length},}\\s*$`).test(lines[i])) {
        body.push(lines[i]);
        i++;
      }
      i++;  // the closing fence (or the end while streaming)
      out.push(codeBlock(m[2], body));
      continue;
    }
    if ((m = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line))) {
      out.push(`<h${m[1].length}>${renderInline(escapeHtml(m[2]))}</h${m[1].length}>`);
      i++;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { out.push("<hr>"); i++; continue; }
    if (/^\s*>/.test(line)) {
      const body = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) { body.push(lines[i].replace(/^\s*>\s?/, "")); i++; }
      out.push(`<blockquote>${renderBlocks(body)}</blockquote>`);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const rows = [line, lines[i + 1]];
      i += 2;
      while (i < lines.length && lines[i].includes("|") && !/^\s*$/.test(lines[i])) { rows.push(lines[i]); i++; }
      out.push(table(rows));
      continue;
    }
    if (LIST_ITEM.test(line)) {
      const body = [line], first = LIST_ITEM.exec(line);
      const kind = m => /\d/.test(m[2]);
      i++;
      while (i < lines.length) {
        const l = lines[i], item = LIST_ITEM.exec(l);
        if (item && item[1].length <= first[1].length + 1 && kind(item) !== kind(first)) break;  // ul then ol
        if (/^\s*$/.test(l)) {
          const next = lines[i + 1];
          if (next !== undefined && (LIST_ITEM.test(next) || /^\s{2,}\S/.test(next))) { i++; continue; }
          break;
        }
        if (LIST_ITEM.test(l) || /^\s{2,}\S/.test(l)) { body.push(l); i++; continue; }
        if (blockEnds(l)) break;
        body.push("  " + l);  // a lazy continuation line
        i++;
      }
      out.push(list(body));
      continue;
    }
    const para = [line];
    i++;
    while (i < lines.length && !blockEnds(lines[i]) && !LIST_ITEM.test(lines[i]) &&
           !(lines[i].includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]))) {
      para.push(lines[i]);
      i++;
    }
    out.push(`<p>${para.map(l => renderInline(escapeHtml(l.trim()))).join("<br>")}</p>`);
  }
  return out.join("");
}

function renderMarkdown(text) {
  // NUL is the placeholder mark of renderInline: it never comes from the text
  return renderBlocks(String(text || "").replace(/\u0000/g, "\ufffd").replace(/\r\n?/g, "\n").split("\n"));
}

if (typeof module !== "undefined") module.exports = { renderMarkdown, escapeHtml, renderInline, safeHref };
