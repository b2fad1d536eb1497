// Strata web app: what every page shares: the header (pages, model, theme switch), copy, number formats.
// Talks only to this server (same origin); nothing is fetched from anywhere else.
"use strict";

const THEME_KEY = "strata.theme";
const API_KEY_KEY = "strata.apiKey";   // a server started with --api-key: the key this browser sends

// fetch on this server, with the API key when this browser has one (the pages themselves are public)
function apiFetch(url, options = {}) {
  const key = localStorage.getItem(API_KEY_KEY);
  const headers = { ...(options.headers || {}) };
  if (key) headers.Authorization = `Bearer ${key}`;
  return fetch(url, { ...options, headers });
}

function applyTheme(theme) {
  const t = theme || localStorage.getItem(THEME_KEY) ||
    (window.matchMedia && matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
  document.documentElement.dataset.theme = t;
  return t;
}

function nav(active) {
  applyTheme();
  const pages = [["/", "Chat"], ["/monitor", "Monitor"], ["/about", "About"]];
  const el = document.querySelector("nav");
  el.textContent = "";
  for (const [href, name] of pages) {
    const a = document.createElement("a");
    a.href = href;
    a.textContent = name;
    if (name === active) a.className = "on";
    el.appendChild(a);
  }
  const model = document.createElement("span");
  model.className = "model";
  model.id = "model";
  model.textContent = "…";
  el.appendChild(model);
  const theme = document.createElement("button");
  theme.type = "button";
  theme.className = "ghost";
  theme.id = "theme";
  theme.title = "Switch between the dark and the light theme";
  const label = () => { theme.textContent = document.documentElement.dataset.theme === "dark" ? "☀" : "☾"; };
  label();
  theme.onclick = () => {
    const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    localStorage.setItem(THEME_KEY, next);
    applyTheme(next);
    label();
  };
  el.appendChild(theme);
  fetch("/health").then(r => r.json()).then(h => {
    model.textContent = `${h.model} · ${h.loaded ? "ready" : h.status}` + (h.max_context ? ` · context ${h.max_context}` : "");
  }).catch(() => { model.textContent = "server unreachable"; });
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try { await navigator.clipboard.writeText(text); return true; } catch (e) { /* fall back below */ }
  }
  const ta = document.createElement("textarea");
  ta.value = text;
  ta.style.position = "fixed";
  ta.style.opacity = "0";
  document.body.appendChild(ta);
  ta.select();
  let ok = false;
  try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
  ta.remove();
  return ok;
}

function flash(button, text) {
  const old = button.textContent;
  button.textContent = text;
  setTimeout(() => { button.textContent = old; }, 1200);
}

// Code blocks rendered by markdown.js carry a Copy button; one listener per container serves them all.
function wireCodeCopy(container) {
  container.addEventListener("click", async e => {
    const b = e.target.closest("button[data-copy=code]");
    if (!b) return;
    const pre = b.closest(".code").querySelector("pre");
    flash(b, (await copyText(pre.textContent)) ? "Copied" : "Copy failed");
  });
}

function fmtNumber(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 100 || Number.isInteger(v) ? Math.round(v).toLocaleString("en") : v.toFixed(digits);
}

function fmtBytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  let s = Math.floor(seconds);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  const parts = [];
  if (d) parts.push(`${d} day${d > 1 ? "s" : ""}`);
  if (h) parts.push(`${h} h`);
  if (m && !d) parts.push(`${m} min`);
  if (!d && !h) parts.push(`${s} s`);
  return parts.join(" ");
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

if (typeof module !== "undefined") module.exports = { fmtDuration, fmtBytes, fmtNumber };
