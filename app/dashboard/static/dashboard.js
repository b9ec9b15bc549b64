// The dashboard's live updates and actions. Plain JS, no build step.
// Every value from the server is written with textContent or as a property,
// never parsed as HTML, so nothing a batch contains can run here.
"use strict";

const POLL_MS = 1500;
const ACTION_HEADERS = { "x-overnight-dashboard": "1", "content-type": "application/json" };
const SVG = "http://www.w3.org/2000/svg";
const refreshers = [];

const OK_MESSAGE_MS = 8000;
let okTimer = null;

// A poll's error stays until a poll succeeds; an action's error until the next action (a
// poll already under way must not wipe it before it is read); a confirmation a few seconds.
let shownByPoll = false;

function flash(message, ok = false, fromPoll = false) {
  const box = document.getElementById("flash");
  box.textContent = message || "";
  box.hidden = !message;
  box.classList.toggle("ok", ok);
  shownByPoll = fromPoll;
  clearTimeout(okTimer);
  if (ok) okTimer = setTimeout(() => flash(""), OK_MESSAGE_MS);
}

function clearError() {
  if (shownByPoll) flash("");
}

async function request(url, options = {}) {
  const response = await fetch(url, { credentials: "same-origin", ...options });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (response.status === 401) {
    location.assign("/dashboard/login?next=" + encodeURIComponent(location.pathname + location.search));
    throw new Error("Your session ended: log in again.");
  }
  if (!response.ok) {
    const message = body && body.error && body.error.message;
    throw new Error(message || `The server answered ${response.status}.`);
  }
  return body;
}

// Elements inside a nested list belong to that list's items, not to `root`.
function ownedBy(root, el) {
  const list = el.closest("[data-list],[data-preview]");
  return !(list && list !== root && root.contains(list));
}

function fill(root, data) {
  const nodes = [root, ...root.querySelectorAll("[data-field],[data-value],[data-href],[data-show],[data-state],[data-url-from],[data-input],[data-input-list]")];
  for (const el of nodes) {
    if (!ownedBy(root, el)) continue;
    const d = el.dataset;
    if (d.field && d.field in data) el.textContent = String(data[d.field]);
    if (d.value && d.value in data) el.value = Number(data[d.value]);
    if (d.state && d.state in data) el.dataset.status = String(data[d.state]);
    if (d.urlFrom && d.urlFrom in data) el.dataset.url = String(data[d.urlFrom]);
    if (d.show && d.show in data) el.hidden = !data[d.show];
    // Form inputs take the server's value once, so that a poll never overwrites typing.
    if (d.input && d.input in data && !d.filled) {
      el.value = String(data[d.input]);
      d.filled = "1";
    }
    if (d.inputList && d.inputList in data && !d.filled) {
      el.checked = data[d.inputList].includes(el.value);
      d.filled = "1";
    }
    if (d.href && d.href in data) {
      if (data[d.href]) el.setAttribute("href", String(data[d.href]));
      else el.removeAttribute("href");
    }
  }
  for (const list of root.querySelectorAll("[data-list]")) {
    if (ownedBy(root, list.parentElement)) syncRows(list, data[list.dataset.list] || []);
  }
  for (const svg of root.querySelectorAll("[data-chart]")) {
    drawChart(svg, data[svg.dataset.chart] || [], Number(data[svg.dataset.chartMax]) || 0);
  }
  for (const svg of root.querySelectorAll("[data-stack]")) {
    if (ownedBy(root, svg) && svg.dataset.stack in data) drawStack(svg, data);
  }
  for (const list of root.querySelectorAll("[data-preview]")) {
    const fileId = data[list.dataset.preview];
    if (fileId) loadPreview(list, String(fileId));
  }
}

// The stacked bar's segments, as percentages of the batch's requests.
function drawStack(svg, data) {
  for (const seg of data[svg.dataset.stack] || []) {
    const rect = svg.querySelector(`rect[data-kind="${seg.kind}"]`);
    if (!rect) continue;
    rect.setAttribute("x", String(seg.x));
    rect.setAttribute("width", String(seg.width));
  }
  svg.dataset.pct = String(data.progress_pct);
  svg.setAttribute("aria-label", `${data.progress} done`);
}

// A file's first lines, fetched once per file (a preview does not change).
async function loadPreview(list, fileId) {
  if (list.dataset.loaded === fileId) return;
  list.dataset.loaded = fileId;
  const caption = list.parentElement.querySelector("[data-preview-caption]");
  try {
    const preview = await request(`/dashboard/api/files/${encodeURIComponent(fileId)}/preview`);
    syncRows(list, preview.lines);
    caption.textContent = preview.caption;
  } catch (e) {
    caption.textContent = e.message;
  }
}

// Makes `container`'s children match `rows`, reusing the element of each key.
function syncRows(container, rows) {
  const template = document.getElementById(container.dataset.template);
  const existing = new Map([...container.children].map((c) => [c.dataset.key, c]));
  const wanted = rows.map((row, i) => {
    const key = String(row.id !== undefined ? row.id : i);
    let node = existing.get(key);
    if (!node) {
      node = template.content.firstElementChild.cloneNode(true);
      node.dataset.key = key;
    }
    fill(node, row);
    return node;
  });
  // Only rows that are new, gone or out of order are touched: a row moved in the DOM (even
  // back to where it was) loses a click whose press and release straddle the poll.
  wanted.forEach((node, i) => {
    if (container.children[i] !== node) container.insertBefore(node, container.children[i] || null);
  });
  while (container.children.length > wanted.length) container.lastElementChild.remove();
  const table = container.closest("table");
  if (table) table.classList.toggle("is-empty", rows.length === 0);
  for (const note of document.querySelectorAll(`[data-show-empty="${container.id}"]`)) {
    note.hidden = rows.length > 0;
  }
}

// A one-time secret (a new webhook endpoint's, a rotated one) in the box next to its action.
function showSecret(near, secret) {
  const box = near.closest("form, article").querySelector("[data-secret]");
  box.querySelector("[data-secret-value]").textContent = secret;
  box.hidden = false;
}

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// Bars scaled to `top` (the y axis' highest label); the axes' labels are page text around it.
function drawChart(svg, series, top) {
  const [w, h] = [600, 160];
  const max = top || Math.max(...series.map((p) => p[1]), 1e-9);
  const slot = w / Math.max(series.length, 1);
  const grid = [0, 0.5].map((f) => svgEl("line", { x1: 0, y1: h * f + 0.5, x2: w, y2: h * f + 0.5, class: "grid-line" }));
  const bars = series.map(([, v], i) => {
    const height = v > 0 ? Math.max((v / max) * h, 1) : 0;
    return svgEl("rect", { x: i * slot + 1, y: h - height, width: Math.max(slot - 2, 1), height, class: "bar" });
  });
  const axes = [
    svgEl("line", { x1: 0, y1: h, x2: w, y2: h, class: "axis" }),
    svgEl("line", { x1: 0.5, y1: 0, x2: 0.5, y2: h, class: "axis" }),
  ];
  svg.replaceChildren(...grid, ...bars, ...axes);
}

function poll(url, apply) {
  const tick = async () => {
    if (!document.hidden) {
      try {
        apply(await request(url));
        clearError();
      } catch (e) {
        flash(e.message, false, true);
      }
    }
  };
  refreshers.push(tick);
  tick();
  setInterval(tick, POLL_MS);
}

async function refreshAll() {
  await Promise.all(refreshers.map((r) => r()));
}

async function act(button) {
  if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
  flash("");
  button.disabled = true;
  try {
    const result = await request(button.dataset.url, { method: "POST", headers: ACTION_HEADERS, body: "{}" });
    if (result && result.href) {
      location.assign(result.href); // the action made a new object: show it
      return;
    }
    if (result && result.secret) showSecret(button, result.secret);
    await refreshAll();
    if (result && result.message) flash(result.message, true);
  } catch (e) {
    flash(e.message);
  } finally {
    button.disabled = false;
  }
}

async function createKey(form) {
  flash("");
  const body = JSON.stringify(Object.fromEntries(new FormData(form)));
  try {
    const created = await request(form.getAttribute("action"), { method: "POST", headers: ACTION_HEADERS, body });
    document.getElementById("new-secret-value").textContent = created.value;
    document.getElementById("new-secret").hidden = false;
    form.reset();
    await refreshAll();
  } catch (e) {
    flash(e.message);
  }
}

// A form posted as JSON: repeated names (checkboxes) become lists. Posted to its `data-url`
// (or `action`); a form in a table no feed refreshes (`data-reload`) reloads the page after.
async function submitJson(form) {
  flash("");
  const body = {};
  for (const [key, value] of new FormData(form)) {
    const many = form.querySelectorAll(`[name="${key}"][type=checkbox]`).length > 0;
    if (many) (body[key] = body[key] || []).push(value);
    else body[key] = value;
  }
  for (const box of form.querySelectorAll("input[type=checkbox][name]")) {
    if (!(box.name in body)) body[box.name] = [];
  }
  try {
    const url = form.dataset.url || form.getAttribute("action");
    const result = await request(url, { method: "POST", headers: ACTION_HEADERS, body: JSON.stringify(body) });
    if ("reload" in form.dataset) {
      location.reload();
      return;
    }
    if (result && result.secret) {
      showSecret(form, result.secret);
      form.reset();
    }
    await refreshAll();
  } catch (e) {
    flash(e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const tbody of document.querySelectorAll("[data-live]")) {
    const url = tbody.dataset.live + ("keepQuery" in tbody.dataset ? location.search : "");
    poll(url, (data) => syncRows(tbody, data.rows));
  }
  for (const section of document.querySelectorAll("[data-live-object]")) {
    poll(section.dataset.liveObject, (data) => fill(section, data));
  }
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }
  const keyForm = document.querySelector("form[data-create-key]");
  if (keyForm) {
    keyForm.addEventListener("submit", (ev) => {
      ev.preventDefault();
      createKey(keyForm);
    });
  }
  document.addEventListener("submit", (ev) => {
    const form = ev.target.closest("form[data-json-form]");
    if (form) {
      ev.preventDefault();
      submitJson(form);
    }
  });
  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("[data-action]");
    if (button) {
      ev.preventDefault();
      act(button);
    }
  });
});
