// The Pepsi web page: the pipeline, the traffic's history, the queue, a
// message, the destinations, the delivery log and the configuration, each
// a view of the JSON API of pepsi-httpd, refreshed live.  Everything it
// shows is put in the page as text (textContent), never as markup, so a
// hostile subject, header or address cannot inject anything.  A viewer
// (role "viewer") sees no action: the elements of class admin-only stay
// hidden, and the server refuses a viewer's action anyway.
"use strict";

const REFRESH_MS = 2000;
let csrf = null;
let role = null;
let refreshTimer = null;
let lastStages = null;      // stage_stats of the previous refresh, for rates
let lastStagesAt = 0;
let currentView = "overview";
let currentMessage = null;
const charts = { traffic: null, queue: null, queueStages: "" };

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

function messageLink(td, id) {
  const link = document.createElement("a");
  link.textContent = id;
  link.href = "#message/" + encodeURIComponent(id);
  td.appendChild(link);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  seconds = Math.round(seconds);
  if (seconds < 120) return seconds + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h";
  return Math.round(seconds / 86400) + " d";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 10) return seconds.toFixed(2) + " s";
  return age(seconds);
}

function when(timestamp) {
  if (!timestamp) return "";
  const d = new Date(timestamp);
  return isNaN(d) ? String(timestamp) : d.toLocaleString();
}

function showLogin() {
  $("main-view").hidden = true;
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("role").textContent = "";
  $("login-view").hidden = false;
  if (refreshTimer) clearInterval(refreshTimer);
  refreshTimer = null;
}

function showMain(session) {
  csrf = session.csrf || null;
  role = session.role || "admin";
  $("who").textContent = session.account;
  $("role").textContent = role === "viewer" ? "(viewer: may read, not act)" : "";
  for (const e of document.querySelectorAll(".admin-only")) e.hidden = role !== "admin";
  $("login-view").hidden = true;
  $("main-view").hidden = false;
  $("nav").hidden = false;
  $("logout").hidden = false;
  route();
  if (!refreshTimer) refreshTimer = setInterval(refresh, REFRESH_MS);
}

// #overview, #queue, #destinations, #log, #config, #message/<id>
function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, ""));
  let view = hash || "overview";
  currentMessage = null;
  if (view.startsWith("message/")) {
    currentMessage = view.slice(8);
    view = "message";
  }
  if (!$("view-" + view)) view = "overview";
  currentView = view;
  for (const section of document.querySelectorAll("main .view")) section.hidden = section.id !== "view-" + view;
  for (const a of $("nav").querySelectorAll("a")) {
    if (a.dataset.view === view) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (view === "message") $("message-action-result").textContent = "";
  refresh();
}

/* ---- Overview: the pipeline, the charts, delays, refusals ---- */

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
}

const TRAFFIC_SERIES = [
  ["received", "Received", "#1f77b4"],
  ["sent", "Delivered", "#2ca02c"],
  ["deferred", "Deferred", "#ff7f0e"],
  ["bounced", "Bounced", "#d62728"],
];
const STAGE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];

function chartWidth(element) {
  return Math.max(320, Math.min(1000, element.clientWidth || 800));
}

// A chart made once and fed new data after; made again when its series change.
function drawChart(element, existing, series, data) {
  if (existing && existing.series.length === series.length + 1) {
    existing.setData(data);
    return existing;
  }
  if (existing) existing.destroy();
  element.replaceChildren();
  return new uPlot({
    width: chartWidth(element),
    height: 220,
    series: [{}].concat(series.map(([, label, colour]) => ({ label, stroke: colour, width: 2 }))),
    scales: { x: { time: true } },
    axes: [{}, { size: 50 }],
  }, data, element);
}

function fillTable(table, header, rows) {
  if (header) {
    const tr = document.createElement("tr");
    for (const h of header) {
      const th = document.createElement("th");
      th.textContent = h;
      tr.appendChild(th);
    }
    table.querySelector("thead").replaceChildren(tr);
  }
  const tbody = table.querySelector("tbody");
  tbody.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement("tr");
    for (const v of r) cell(tr, v, typeof v === "number" ? "number" : null);
    tbody.appendChild(tr);
  }
}

async function refreshHistory() {
  const span = $("history-span").value;
  const points = (await api("GET", "/api/history?span=" + encodeURIComponent(span))) || [];
  for (const e of document.querySelectorAll(".span-step")) e.textContent = span === "day" ? "5 minutes" : "minute";
  $("history-empty").hidden = points.length > 0;
  const xs = points.map((p) => p.at);

  const traffic = [xs].concat(TRAFFIC_SERIES.map(([key]) => points.map((p) => p[key])));
  charts.traffic = drawChart($("chart-traffic"), charts.traffic, TRAFFIC_SERIES, traffic);
  fillTable($("traffic-data"), null, points.map((p) => [new Date(p.at * 1000).toLocaleTimeString(),
    p.received, p.sent, p.deferred, p.bounced, p.expired, p.refused]));

  const stages = [...new Set(points.flatMap((p) => Object.keys(p.queue || {})))].sort();
  const stageSeries = stages.map((s, i) => [s, s, STAGE_COLOURS[i % STAGE_COLOURS.length]]);
  const depth = [xs].concat(stages.map((s) => points.map((p) => (p.queue && p.queue[s]) || 0)));
  if (charts.queueStages !== stages.join("\n") && charts.queue) {
    charts.queue.destroy();
    charts.queue = null;
  }
  charts.queueStages = stages.join("\n");
  charts.queue = drawChart($("chart-queue"), charts.queue, stageSeries, depth);
  fillTable($("queue-depth-data"), ["At"].concat(stages),
    points.map((p) => [new Date(p.at * 1000).toLocaleTimeString()].concat(stages.map((s) => (p.queue && p.queue[s]) || 0))));
}

async function refreshDelays() {
  const delays = (await api("GET", "/api/delays")) || {};
  const tbody = $("delays").querySelector("tbody");
  tbody.replaceChildren();
  for (const [span, label] of [["hour", "hour"], ["day", "day"]]) {
    const rows = delays[span] || [];
    const q = (quantile) => {
      const r = rows.find((x) => Math.abs(x.quantile - quantile) < 1e-9);
      return r ? duration(r.seconds) : "";
    };
    const row = document.createElement("tr");
    row.dataset.span = span;
    cell(row, label);
    cell(row, rows.length ? rows[0].deliveries : 0, "number deliveries");
    cell(row, q(0.5), "number p50");
    cell(row, q(0.9), "number p90");
    cell(row, q(0.99), "number p99");
    tbody.appendChild(row);
  }
}

async function refreshRefusals() {
  const refusals = (await api("GET", "/api/refusals")) || [];
  const tbody = $("refusals").querySelector("tbody");
  tbody.replaceChildren();
  for (const r of refusals) {
    const row = document.createElement("tr");
    row.dataset.code = r.code;
    cell(row, r.code);
    cell(row, r.refusals, "number count");
    cell(row, when(r.updated_at));
    tbody.appendChild(row);
  }
}

async function refreshOverview() {
  await Promise.all([refreshPipeline(), refreshHistory(), refreshDelays(), refreshRefusals()]);
}

/* ---- The queue ---- */

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
    const td = document.createElement("td");
    td.className = "admin-only";
    td.hidden = role !== "admin";
    if (role === "admin") {
      const check = document.createElement("input");
      check.type = "checkbox";
      check.value = m.id;
      check.checked = selected.has(String(m.id));
      check.setAttribute("aria-label", "select message " + m.id);
      td.appendChild(check);
    }
    row.appendChild(td);
    messageLink(cell(row, ""), m.id);
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

async function act(action, ids, result) {
  if (ids.length === 0) {
    result.textContent = "Select messages first.";
    return;
  }
  if (action === "delete" && !confirm("Delete " + ids.length + " message(s) without a bounce?")) return;
  if (action === "bounce" && !confirm("Bounce " + ids.length + " message(s) to their senders?")) return;
  try {
    const r = await api("POST", "/api/queue/" + action, { ids });
    result.textContent = action + ": " + r.count + " of " + ids.length;
  } catch (e) {
    result.textContent = action + " failed: " + e.message;
  }
  await refresh();
}

/* ---- One message ---- */

function decodeHeaders(base64) {
  try {
    const bytes = Uint8Array.from(atob(base64 || ""), (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8").decode(bytes);
  } catch (e) {
    return "(headers not readable)";
  }
}

async function refreshMessage() {
  if (currentMessage === null) return;
  const id = currentMessage;
  let m;
  try {
    m = await api("GET", "/api/queue/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status === 401) throw e;
    $("message-id").textContent = id;
    $("message-envelope").querySelector("tbody").replaceChildren();
    $("message-headers").textContent = "";
    $("message-state").textContent = "";
    $("message-log").querySelector("tbody").replaceChildren();
    $("message-gone").hidden = true;
    $("message-action-result").textContent = e.message;
    return;
  }
  if (id !== currentMessage) return;
  $("message-id").textContent = m.id;
  $("message-gone").hidden = !m.gone;
  $("message-actions").hidden = role !== "admin" || !!m.gone;
  const envelope = $("message-envelope").querySelector("tbody");
  envelope.replaceChildren();
  const fields = m.gone ? [] : [
    ["Stage", m.stage], ["Status", m.held ? "held" : m.status], ["From", m.mail_from || "<>"],
    ["To", (m.rcpt_to || []).join(", ")], ["Received", when(m.received_at)],
    ["Retry at", when(m.retry_at)], ["Sender key", m.sender_key], ["Body", m.body_size + " bytes"],
  ];
  for (const [name, value] of fields) {
    const row = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = name;
    row.appendChild(th);
    cell(row, value);
    envelope.appendChild(row);
  }
  $("message-headers").textContent = m.gone ? "" : decodeHeaders(m.headers_base64);
  $("message-state").textContent = m.gone ? "" : JSON.stringify(m.state, null, 2);
  const log = $("message-log").querySelector("tbody");
  log.replaceChildren();
  for (const l of m.log || []) {
    const row = document.createElement("tr");
    cell(row, when(l.at));
    cell(row, l.event, "event");
    cell(row, l.event === "delivery" ? deliveryLine(l.detail || {}) : JSON.stringify(l.detail), "detail");
    log.appendChild(row);
  }
  $("message-log-empty").hidden = (m.log || []).length > 0;
}

/* ---- Destinations, the delivery log, the configuration ---- */

// The TLS policy of a destination's last delivery and what it gave, else the MTA-STS policy held for it.
const TLS_POLICY_NAMES = {
  "dane": "DANE", "dane-encrypt": "DANE (encryption only)", "sts enforce": "MTA-STS enforce",
  "sts testing": "MTA-STS testing", "sts none": "MTA-STS none", "opportunistic": "opportunistic",
};
function tlsPolicyText(d) {
  if (!d.tls_policy) return "none known (opportunistic)";
  const name = TLS_POLICY_NAMES[d.tls_policy] || d.tls_policy;
  return d.tls_outcome ? name + ": " + d.tls_outcome : name;
}

async function refreshDestinations() {
  const rows = (await api("GET", "/api/destinations")) || [];
  const tbody = $("destinations").querySelector("tbody");
  tbody.replaceChildren();
  for (const d of rows) {
    const row = document.createElement("tr");
    row.dataset.domain = d.domain;
    cell(row, d.domain);
    cell(row, d.deferred, "number deferred");
    cell(row, d.failures, "number failures");
    cell(row, when(d.backoff_until));
    cell(row, d.last_error, "last-error");
    cell(row, when(d.last_success));
    const limits = [];
    if (d.concurrency_limit) limits.push(d.concurrency_limit + " at once");
    if (d.messages_per_minute) limits.push(d.messages_per_minute + "/min");
    cell(row, limits.join(", "));
    cell(row, tlsPolicyText(d), "tls-policy");
    tbody.appendChild(row);
  }
  $("destinations-empty").hidden = rows.length > 0;
}

// A delivery's mail_log detail as the delivery log line says it (common/delivery/maillog.c).
function deliveryLine(d) {
  let line = "to=<" + (d.to || "") + ">";
  if (d.orig_to) line += ", orig_to=<" + d.orig_to + ">";
  line += ", relay=" + (d.relay || "none");
  if (typeof d.delay === "number") line += ", delay=" + d.delay.toFixed(2);
  if (d.delays) {
    line += ", delays=" + [d.delays.queue, d.delays.stage, d.delays.connection, d.delays.transmission]
      .map((x) => (typeof x === "number" ? x.toFixed(2) : "?")).join("/");
  }
  line += ", dsn=" + (d.dsn || "") + ", status=" + (d.status || "") + " (" + (d.reply || "") +
    (d.note ? "; " + d.note : "") + ")";
  if (d.tls) line += ", tls=" + d.tls;
  if (d.tls_policy) line += ", tls_policy=" + d.tls_policy.outcome + (d.tls_policy.result ? "; " + d.tls_policy.result : "");
  return line;
}

async function refreshLog() {
  const rows = (await api("GET", "/api/log")) || [];
  const tbody = $("delivery-log").querySelector("tbody");
  tbody.replaceChildren();
  for (const l of rows) {
    const row = document.createElement("tr");
    row.dataset.id = l.workqueue_id;
    row.className = (l.detail && l.detail.status) || "";
    cell(row, when(l.at));
    messageLink(cell(row, ""), l.workqueue_id);
    cell(row, deliveryLine(l.detail || {}), "line");
    tbody.appendChild(row);
  }
  $("delivery-log-empty").hidden = rows.length > 0;
}

let configRows = [];

function showConfig() {
  const filter = $("config-filter").value.trim().toLowerCase();
  const tbody = $("config").querySelector("tbody");
  tbody.replaceChildren();
  for (const c of configRows) {
    if (filter && !(c.section + " " + c.option).toLowerCase().includes(filter)) continue;
    const row = document.createElement("tr");
    row.dataset.section = c.section;
    row.dataset.option = c.option;
    row.dataset.scope = c.scope;
    if (!c.in_force) row.className = "overridden";
    cell(row, c.section);
    cell(row, c.option);
    cell(row, c.value, "value");
    cell(row, c.scope + (c.in_force ? "" : " (overridden)"), "scope");
    cell(row, c.origin, "origin");
    tbody.appendChild(row);
  }
}

async function refreshConfig() {
  configRows = (await api("GET", "/api/config/in-force")) || [];
  showConfig();
}

/* ---- Refreshing the view shown ---- */

const REFRESHERS = {
  overview: refreshOverview,
  queue: refreshQueue,
  message: refreshMessage,
  destinations: refreshDestinations,
  log: refreshLog,
  config: refreshConfig,
};
let refreshing = false;

// The views may be read from a standby ([httpd] READ_CONNINFO): then say
// how far behind it is.
async function refreshReplica() {
  const replica = await api("GET", "/api/replica").catch(() => null);
  const note = $("replica-lag");
  if (replica && replica.standby) {
    note.textContent = "; read from a standby, replication lag " + replica.lag_seconds + " s";
    note.hidden = false;
  } else {
    note.textContent = "";
    note.hidden = true;
  }
}

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    // The configuration changes seldom, and a refresh would lose the reader's place.
    if (currentView !== "config" || configRows.length === 0) await REFRESHERS[currentView]();
    $("refreshed-at").textContent = "last at " + new Date().toLocaleTimeString();
    await refreshReplica();
  } catch (e) {
    if (e.status === 401) showLogin();
    else $("refreshed-at").textContent = "refresh failed: " + e.message;
  } finally {
    refreshing = false;
  }
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
      showMain(await api("GET", "/api/session").catch(() => session));
    } catch (e) {
      $("login-error").textContent = e.message;
    }
  });
  $("logout").addEventListener("click", async () => {
    try { await api("DELETE", "/api/session"); } catch (e) { /* gone already */ }
    csrf = null;
    showLogin();
  });
  window.addEventListener("hashchange", route);
  $("history-span").addEventListener("change", () => {
    for (const c of [charts.traffic, charts.queue]) if (c) c.destroy();
    charts.traffic = charts.queue = null;
    refresh();
  });
  $("config-filter").addEventListener("input", showConfig);
  $("queue-filter").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  $("select-all").addEventListener("change", (event) => {
    for (const c of $("queue").querySelectorAll("tbody input[type=checkbox]")) c.checked = event.target.checked;
  });
  for (const button of $("queue-actions").querySelectorAll("button")) {
    button.addEventListener("click", () => act(button.dataset.action,
      [...$("queue").querySelectorAll("tbody input:checked")].map((c) => Number(c.value)), $("action-result")));
  }
  for (const button of $("message-actions").querySelectorAll("button")) {
    button.addEventListener("click", () => act(button.dataset.action,
      currentMessage === null ? [] : [Number(currentMessage)], $("message-action-result")));
  }
  try {
    showMain(await api("GET", "/api/session"));
  } catch (e) {
    showLogin();
  }
});
