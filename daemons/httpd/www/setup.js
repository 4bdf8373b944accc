// pepsi-httpd's first-run setup page (daemons/httpd/setup_web.c): the
// interview's questions come from the server (common/setup/setup_model.c),
// the answers go back as JSON with the session's CSRF token, each refused
// answer is shown beside its question, and once the tasks are enqueued
// their status and log lines are polled every 2 s.  No inline script and
// no HTML from data: every text is set with textContent.
"use strict";

const POLL_MS = 2000;
let csrf = "";

function $(id) {
  return document.getElementById(id);
}

function showError(text) {
  $("setup-error").textContent = text;
}

async function errorOf(response) {
  try {
    const body = await response.json();
    return body.error || response.statusText;
  } catch (e) {
    return response.status + " " + response.statusText;
  }
}

function buildForm(questions) {
  const holder = $("questions");
  holder.replaceChildren();
  for (const q of questions) {
    const p = document.createElement("p");
    const label = document.createElement("label");
    const input = document.createElement("input");
    const why = document.createElement("span");
    label.htmlFor = "q-" + q.name;
    label.textContent = q.prompt;
    input.id = "q-" + q.name;
    input.name = q.name;
    input.size = 60;
    if (q.default !== null) input.placeholder = q.default;
    else input.required = true;
    why.id = "why-" + q.name;
    why.className = "error";
    p.append(label, document.createElement("br"), input, " ", why);
    holder.append(p);
  }
  $("interview-view").hidden = false;
}

async function submit(event) {
  event.preventDefault();
  const answers = {};
  for (const input of $("questions").querySelectorAll("input")) {
    answers[input.name] = input.value.trim();
    $("why-" + input.name).textContent = "";
  }
  $("interview-error").textContent = "";
  $("interview-submit").disabled = true;
  try {
    const response = await fetch("/api/setup", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify({ answers }),
    });
    if (response.status === 422) {
      const body = await response.json();
      $("interview-error").textContent = body.error;
      for (const [name, why] of Object.entries(body.fields || {})) {
        const span = $("why-" + name);
        if (span) span.textContent = why;
      }
      return;
    }
    if (!response.ok) {
      $("interview-error").textContent = await errorOf(response);
      return;
    }
    $("interview-view").hidden = true;
    showLog();
  } finally {
    $("interview-submit").disabled = false;
  }
}

function renderTasks(tasks) {
  const body = $("tasks").querySelector("tbody");
  const rows = [];
  let finished = 0;
  for (const t of tasks) {
    const tr = document.createElement("tr");
    const cells = [String(t.id), t.kind, t.status, t.lines.join("\n")];
    tr.className = t.status;
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (i === 0) td.className = "number";
      if (i === 3) td.className = "line";
      tr.append(td);
    });
    rows.push(tr);
    if (t.status !== "pending" && t.status !== "running") finished++;
  }
  body.replaceChildren(...rows);
  $("log-summary").textContent =
    finished + " of " + tasks.length + " tasks finished" + (finished === tasks.length ? "." : "; waiting for pepsi-setup apply.");
}

async function poll() {
  try {
    const response = await fetch("/api/setup/log");
    if (!response.ok) {
      showError(await errorOf(response));
      return;
    }
    showError("");
    renderTasks(await response.json());
  } catch (e) {
    showError("the server does not answer: " + e.message);
  }
  setTimeout(poll, POLL_MS);
}

function showLog() {
  $("log-view").hidden = false;
  poll();
}

async function start() {
  const response = await fetch("/api/setup");
  if (!response.ok) {
    showError(await errorOf(response));
    return;
  }
  const state = await response.json();
  csrf = state.csrf;
  if (state.submitted) showLog();
  else buildForm(state.questions);
}

// The token is used up: out of the address bar and the history.
if (location.search) history.replaceState(null, "", "/setup");
$("interview").addEventListener("submit", submit);
start();
