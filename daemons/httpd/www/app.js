// The Pepsi web page: the pipeline and the queue, refreshed live, with the
// operator actions.  Everything it shows comes from the JSON API of
// pepsi-httpd and is put in the page as text (textContent), never as
// markup, so a hostile subject or address cannot inject anything.
"use strict";

const REFRESH_MS = 2000;
let csrf = null;
let refreshTimer = null;
let lastStages = null;      // stage_stats of the previous refresh, for rates
let lastStagesAt = 0;

const $ = (id) => document.getElementById(id);

async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && csrf) headers["X-CSRF-Token"] = csrf;
  const response = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const error = new Error((data && data.error) || response.statusText);
    error.status = response.status;
    throw error;
  }
  return data;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  seconds = Math.round(seconds);
  if (seconds < 120) return seconds + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h";
  return Math.round(seconds / 86400) + " d";
}

function showLogin() {
  $("main-view").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login-view").hidden = false;
  if (refreshTimer) clearInterval(refreshTimer);
  refreshTimer = null;
}

function showMain(session) {
  csrf = session.csrf || null;
  $("who").textContent = session.account;
  $("login-view").hidden = true;
  $("main-view").hidden = false;
  $("logout").hidden = false;
  refresh();
  if (!refreshTimer) refreshTimer = setInterval(refresh, REFRESH_MS);
}

async function refreshPipeline() {
  const [summary, stages] = await Promise.all([api("GET", "/api/summary"), api("GET", "/api/stages")]);
  const byStage = new Map();
  for (const row of summary || []) {
    if (!byStage.has(row.stage)) byStage.set(row.stage, {});
    const s = byStage.get(row.stage);
    s[row.status] = row.messages;
    s.held = (s.held || 0) + row.held;
    if (!s.oldest || row.oldest_age_seconds > s.oldest) s.oldest = row.oldest_age_seconds;
  }
  const now = Date.now();
  const rates = new Map();
  for (const st of stages || []) {
    if (!byStage.has(st.stage)) byStage.set(st.stage, {});
    if (lastStages && lastStages.has(st.stage) && now > lastStagesAt) {
      rates.set(st.stage, (st.messages - lastStages.get(st.stage)) * 1000 / (now - lastStagesAt));
    }
  }
  lastStages = new Map((stages || []).map((s) => [s.stage, s.messages]));
  lastStagesAt = now;

  const tbody = $("pipeline").querySelector("tbody");
  tbody.replaceChildren();
  for (const stage of [...byStage.keys()].sort()) {
    const s = byStage.get(stage);
    const row = document.createElement("tr");
    row.dataset.stage = stage;
    cell(row, stage);
    cell(row, s.pending || 0, "number pending");
    cell(row, s.running || 0, "number running");
    cell(row, (s.paused || 0) - (s.held || 0), "number paused");
    cell(row, s.held || 0, "number held");
    cell(row, (s.failed || 0) + (s.timeout || 0), "number failed");
    cell(row, age(s.oldest));
    const rate = rates.get(stage);
    cell(row, rate === undefined ? "" : rate.toFixed(1), "number");
    tbody.appendChild(row);
  }
  $("refreshed-at").textContent = "last at " + new Date().toLocaleTimeString();
}

function queueQuery() {
  const params = new URLSearchParams();
  const search = $("queue-search").value.trim();
  const stage = $("queue-stage").value.trim();
  const status = $("queue-status").value;
  if (search) params.set("search", search);
  if (stage) params.set("stage", stage);
  if (status) params.set("status", status);
  params.set("limit", "200");
  return "/api/queue?" + params.toString();
}

async function refreshQueue() {
  const rows = await api("GET", queueQuery());
  const tbody = $("queue").querySelector("tbody");
  const selected = new Set([...tbody.querySelectorAll("input:checked")].map((c) => c.value));
  tbody.replaceChildren();
  for (const m of rows || []) {
    const row = document.createElement("tr");
    row.dataset.id = m.id;
    row.className = m.held ? "held" : m.status;
    const check = document.createElement("input");
    check.type = "checkbox";
    check.value = m.id;
    check.checked = selected.has(String(m.id));
    check.setAttribute("aria-label", "select message " + m.id);
    const td = document.createElement("td");
    td.appendChild(check);
    row.appendChild(td);
    const idCell = cell(row, "");
    const link = document.createElement("a");
    link.textContent = m.id;
    link.addEventListener("click", () => showMessage(m.id));
    idCell.appendChild(link);
    cell(row, m.stage);
    cell(row, m.held ? "held" : m.status, "status");
    cell(row, age(m.age_seconds));
    cell(row, m.mail_from || "<>");
    cell(row, (m.rcpt_to || []).join(", "));
    cell(row, m.size, "number");
    cell(row, m.last_error);
    tbody.appendChild(row);
  }
  $("queue-empty").hidden = (rows || []).length > 0;
}

async function showMessage(id) {
  try {
    const m = await api("GET", "/api/queue/" + encodeURIComponent(id));
    let headers = "";
    try {
      const bytes = Uint8Array.from(atob(m.headers_base64), (c) => c.charCodeAt(0));
      headers = new TextDecoder("utf-8").decode(bytes);
    } catch (e) { headers = "(headers not readable)"; }
    $("message-id").textContent = m.id;
    $("message-detail").textContent =
      "Stage: " + m.stage + "   Status: " + (m.held ? "held" : m.status) + "\n" +
      "From: " + (m.mail_from || "<>") + "\nTo: " + (m.rcpt_to || []).join(", ") + "\n" +
      "Received: " + m.received_at + (m.retry_at ? "   Retry at: " + m.retry_at : "") + "\n" +
      "Body: " + m.body_size + " bytes\n\nState: " + JSON.stringify(m.state, null, 2) +
      "\n\n" + headers;
    $("message-view").hidden = false;
  } catch (e) {
    $("action-result").textContent = e.message;
  }
}

async function refresh() {
  try {
    await Promise.all([refreshPipeline(), refreshQueue()]);
  } catch (e) {
    if (e.status === 401) showLogin();
    else $("refreshed-at").textContent = "refresh failed: " + e.message;
  }
}

async function act(action) {
  const ids = [...$("queue").querySelectorAll("tbody input:checked")].map((c) => Number(c.value));
  if (ids.length === 0) {
    $("action-result").textContent = "Select messages first.";
    return;
  }
  if (action === "delete" && !confirm("Delete " + ids.length + " message(s) without a bounce?")) return;
  try {
    const result = await api("POST", "/api/queue/" + action, { ids });
    $("action-result").textContent = action + ": " + result.count + " of " + ids.length;
  } catch (e) {
    $("action-result").textContent = action + " failed: " + e.message;
  }
  await refresh();
}

document.addEventListener("DOMContentLoaded", async () => {
  $("refresh-seconds").textContent = REFRESH_MS / 1000;
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("login-error").textContent = "";
    try {
      const session = await api("POST", "/api/login",
        { name: $("login-name").value, password: $("login-password").value });
      $("login-password").value = "";
      showMain(session);
    } catch (e) {
      $("login-error").textContent = e.message;
    }
  });
  $("logout").addEventListener("click", async () => {
    try { await api("DELETE", "/api/session"); } catch (e) { /* gone already */ }
    csrf = null;
    showLogin();
  });
  $("queue-filter").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  $("select-all").addEventListener("change", (event) => {
    for (const c of $("queue").querySelectorAll("tbody input[type=checkbox]")) c.checked = event.target.checked;
  });
  for (const button of $("queue-actions").querySelectorAll("button")) {
    button.addEventListener("click", () => act(button.dataset.action));
  }
  try {
    showMain(await api("GET", "/api/session"));
  } catch (e) {
    showLogin();
  }
});
