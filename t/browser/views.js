// Drives each view of pepsi-httpd's web page in a real browser (Debian's
// headless Chromium, through playwright-core) and checks it shows what
// t/097_httpd_views.pl put in: the charts' points for the messages it
// sent, the delay percentiles, the refusals, its deferred message's page
// (hostile header shown as text), the destination, the delivery log, the
// configuration with where each value comes from; then a viewer, who sees
// no action.  A screenshot per view goes to SHOTS.
//
//   node views.js BASE ADMIN PASSWORD VIEWER VIEWER_PASSWORD MESSAGE_ID SHOTS EXPECTED_JSON
//
// Prints one line per step ("ok <what>", or "fail <what>: <why>") and
// exits 0, or 1 at the first failure.
"use strict";

const { chromium } = require("playwright-core");

const [base, admin, adminPassword, viewer, viewerPassword, messageId, shots, expectedJson] =
  process.argv.slice(2);
const expected = JSON.parse(expectedJson);
const executable = process.env.CHROMIUM || "/usr/bin/chromium";
const T = 30000;

async function step(what, action) {
  try {
    await action();
    console.log("ok " + what);
  } catch (e) {
    console.log("fail " + what + ": " + String(e.message || e).split("\n")[0]);
    throw e;
  }
}

// The sums of a table's numeric columns, by header.
async function columnSums(page, table) {
  return page.evaluate((selector) => {
    const t = document.querySelector(selector);
    const heads = [...t.querySelectorAll("thead th")].map((h) => h.textContent);
    const sums = {};
    for (const row of t.querySelectorAll("tbody tr")) {
      [...row.querySelectorAll("td")].forEach((td, i) => {
        const n = Number(td.textContent);
        if (td.textContent !== "" && !isNaN(n)) sums[heads[i]] = (sums[heads[i]] || 0) + n;
      });
    }
    return sums;
  }, table);
}

async function login(page, name, password) {
  await page.goto(base + "/#overview");
  await page.locator("#login-view").waitFor({ state: "visible", timeout: T });
  await page.fill("#login-name", name);
  await page.fill("#login-password", password);
  await page.click("#login-submit");
  await page.locator("#main-view").waitFor({ state: "visible", timeout: T });
}

async function show(page, hash, section) {
  await page.evaluate((h) => { location.hash = h; }, hash);
  await page.locator(section).waitFor({ state: "visible", timeout: T });
}

(async () => {
  const browser = await chromium.launch({
    executablePath: executable,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  const outside = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && !/^Failed to load resource/.test(m.text())) errors.push(m.text());
  });
  // Everything the page loads must come from pepsi-httpd itself.
  page.on("request", (r) => { if (!r.url().startsWith(base)) outside.push(r.url()); });
  page.on("dialog", (d) => d.accept());
  const shot = (name) => page.screenshot({ path: shots + "/" + name + ".png", fullPage: true });
  try {
    await step("an administrator logs in", async () => {
      await login(page, admin, adminPassword);
      await page.locator("#view-overview").waitFor({ state: "visible", timeout: T });
    });
    await step("the traffic chart's points count the messages sent", async () => {
      await page.locator("#chart-traffic canvas").first().waitFor({ timeout: T });
      let sums = {};
      const deadline = Date.now() + 60000;
      for (;;) {
        sums = await columnSums(page, "#traffic-data");
        if (sums.Received === expected.received && sums.Delivered === expected.sent
            && (sums.Deferred || 0) >= 1 && sums.Refused === expected.refused) break;
        if (Date.now() > deadline) throw new Error("the chart's numbers: " + JSON.stringify(sums));
        await page.waitForTimeout(500);
      }
    });
    await step("the queue depth chart shows the deferred message at its stage", async () => {
      await page.locator("#chart-queue canvas").first().waitFor({ timeout: T });
      await page.waitForFunction((stage) => {
        const t = document.querySelector("#queue-depth-data");
        const heads = [...t.querySelectorAll("thead th")].map((h) => h.textContent);
        const col = heads.indexOf(stage);
        const rows = t.querySelectorAll("tbody tr");
        return col > 0 && rows.length > 0
          && Number(rows[rows.length - 1].querySelectorAll("td")[col].textContent) >= 1;
      }, expected.deferred_stage, { timeout: T });
    });
    await step("the delay percentiles count the deliveries", async () => {
      await page.waitForFunction((n) => {
        const row = document.querySelector('#delays tbody tr[data-span="hour"]');
        return row && Number(row.querySelector("td.deliveries").textContent) === n
          && row.querySelector("td.p50").textContent.endsWith(" s");
      }, expected.sent, { timeout: T });
    });
    await step("the refusals by code", async () => {
      await page.waitForFunction((n) => {
        const row = document.querySelector('#refusals tbody tr[data-code="500"]');
        return row && Number(row.querySelector("td.count").textContent) === n;
      }, expected.refused, { timeout: T });
    });
    await shot("overview");

    await step("the queue lists the deferred message", async () => {
      await show(page, "#queue", "#view-queue");
      await page.locator(`#queue tbody tr[data-id="${messageId}"]`).waitFor({ timeout: T });
      await page.locator("#queue-actions").waitFor({ state: "visible", timeout: T });
    });
    await shot("queue");

    await step("the message page: envelope, headers as text, state, history", async () => {
      await page.click(`#queue tbody tr[data-id="${messageId}"] a`);
      await page.locator("#view-message").waitFor({ state: "visible", timeout: T });
      await page.locator("#message-envelope", { hasText: expected.deferred_rcpt }).waitFor({ timeout: T });
      await page.locator("#message-headers", { hasText: expected.subject }).waitFor({ timeout: T });
      const markup = await page.evaluate(() =>
        document.querySelectorAll("#view-message img, #view-message script, #view-message b").length);
      if (markup !== 0) throw new Error("the hostile header became " + markup + " element(s)");
      await page.locator("#message-state", { hasText: "last_error" }).waitFor({ timeout: T });
      await page.locator("#message-log td.event", { hasText: "delivery" }).first().waitFor({ timeout: T });
      await page.locator("#message-log td.detail", { hasText: "status=deferred (451 " }).first()
        .waitFor({ timeout: T });
    });
    await step("the message page's actions: hold, then release", async () => {
      // The dispatcher retries the deferred row every 2 s: a hold that
      // finds it running is refused ("hold failed: ... is running"), as it
      // should be, and the user clicks again, as the test does (20 times at most).
      for (let attempt = 1; ; attempt++) {
        await page.evaluate(() => { document.getElementById("message-action-result").textContent = ""; });
        await page.click('#message-actions button[data-action="hold"]');
        const said = page.locator("#message-action-result", { hasText: /^hold/ });
        await said.waitFor({ timeout: T });
        const text = await said.textContent();
        if (text.includes("hold: 1 of 1")) break;
        if (!/is running/.test(text) || attempt === 20) throw new Error("the hold said: " + text);
        await page.waitForTimeout(300);
      }
      await page.locator("#message-envelope", { hasText: "held" }).waitFor({ timeout: T });
      await page.click('#message-actions button[data-action="release"]');
      await page.locator("#message-action-result", { hasText: "release: 1 of 1" }).waitFor({ timeout: T });
    });
    await shot("message");

    await step("the destination with deferred mail, its last error and TLS policy", async () => {
      await show(page, "#destinations", "#view-destinations");
      const row = page.locator(`#destinations tbody tr[data-domain="${expected.domain}"]`);
      await row.waitFor({ timeout: T });
      await page.waitForFunction((d) => {
        const r = document.querySelector(`#destinations tbody tr[data-domain="${d.domain}"]`);
        return r && Number(r.querySelector("td.deferred").textContent) >= 1
          && r.querySelector("td.last-error").textContent.includes(d.error)
          && r.querySelector("td.tls-policy").textContent === d.tls;
      }, { domain: expected.domain, error: expected.deferred_error, tls: expected.tls_policy }, { timeout: T });
    });
    await shot("destinations");

    await step("the delivery log's last lines", async () => {
      await show(page, "#log", "#view-log");
      await page.waitForFunction((n) => {
        const lines = [...document.querySelectorAll("#delivery-log td.line")].map((t) => t.textContent);
        return lines.filter((l) => /status=sent \(/.test(l)).length === n
          && lines.some((l) => /status=deferred \(451 /.test(l));
      }, expected.sent, { timeout: T });
    });
    await shot("log");

    await step("the configuration in force, with where each value comes from", async () => {
      await show(page, "#config", "#view-config");
      await page.waitForFunction((c) => {
        const rows = [...document.querySelectorAll("#config tbody tr")];
        const file = rows.find((r) => r.dataset.section === c.section && r.dataset.option === c.option
          && r.dataset.scope === "file");
        const over = rows.find((r) => r.dataset.section === c.section && r.dataset.option === c.option
          && r.dataset.scope === "global");
        const dflt = rows.find((r) => r.dataset.scope === "default");
        return file && over && dflt
          && /pepsi\.conf:\d+$/.test(file.querySelector("td.origin").textContent)
          && file.classList.contains("overridden")
          && over.querySelector("td.value").textContent === c.value
          && over.querySelector("td.origin").textContent.startsWith("pepsi.config_override");
      }, expected.override, { timeout: T });
      const shown = await page.evaluate(() => document.querySelector("#config").textContent);
      if (shown.includes(expected.secret)) throw new Error("a password in a CONNINFO is shown");
    });
    await shot("config");

    await step("no script error, nothing loaded from elsewhere", async () => {
      if (errors.length) throw new Error(errors.join("; "));
      if (outside.length) throw new Error(outside.join(" "));
    });

    await step("a viewer sees the pages without an action", async () => {
      await page.click("#logout");
      await page.locator("#login-view").waitFor({ state: "visible", timeout: T });
      await login(page, viewer, viewerPassword);
      await show(page, "#queue", "#view-queue");
      await page.locator(`#queue tbody tr[data-id="${messageId}"]`).waitFor({ timeout: T });
      if (await page.locator("#queue-actions").isVisible()) throw new Error("the queue's buttons show");
      if (await page.locator("#queue input[type=checkbox]").count() > 0
          && await page.locator("#queue input[type=checkbox]").first().isVisible()) {
        throw new Error("the queue's checkboxes show");
      }
      await show(page, "#message/" + messageId, "#view-message");
      await page.locator("#message-headers", { hasText: expected.subject }).waitFor({ timeout: T });
      if (await page.locator("#message-actions").isVisible()) throw new Error("the message's buttons show");
      const visible = await page.evaluate(() =>
        [...document.querySelectorAll("button[data-action]")].filter((b) => b.offsetParent !== null).length);
      if (visible !== 0) throw new Error(visible + " action button(s) visible");
    });
    await shot("viewer-message");
  } catch (e) {
    if (errors.length) console.log("# script errors: " + errors.join("; "));
    await shot("failure").catch(() => {});
    await browser.close();
    process.exit(1);
  }
  await browser.close();
})();
