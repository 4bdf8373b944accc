// Drives pepsi-httpd's first-run setup page in a real browser (Debian's
// headless Chromium, through playwright-core) for t/147_setup_web.pl: the
// one-time link, followed from a page of another site, opens the
// interview (and leaves the address bar), a
// change without the CSRF token is refused, a domain that is not one is
// shown with its reason, the answers enqueue the tasks, and once the test
// runs pepsi-setup apply their log lines appear on the page; the same
// link is then refused.  A screenshot per step goes to SHOTS.
//
//   node setup.js LINK ANSWERS_JSON SHOTS
//
// Prints one line per step ("ok <what>", or "fail <what>: <why>") and
// exits 0, or 1 at the first failure.
"use strict";

const { chromium } = require("playwright-core");

const [link, answersJson, shots] = process.argv.slice(2);
const answers = JSON.parse(answersJson);
const executable = process.env.CHROMIUM || "/usr/bin/chromium";
const T = 30000;
// pepsi-setup apply is run by the test once the tasks are listed.
const APPLY_T = 120000;

async function step(what, action) {
  try {
    await action();
    console.log("ok " + what);
  } catch (e) {
    console.log("fail " + what + ": " + String(e.message || e).split("\n")[0]);
    throw e;
  }
}

async function fill(page, values) {
  for (const [name, value] of Object.entries(values)) await page.fill("#q-" + name, value);
}

(async () => {
  const browser = await chromium.launch({
    executablePath: executable,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  const base = new URL(link).origin;
  const errors = [];
  const outside = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && !/^Failed to load resource/.test(m.text())) errors.push(m.text());
  });
  page.on("request", (r) => { if (!r.url().startsWith(base)) outside.push(r.url()); });
  const shot = (p, name) => p.screenshot({ path: shots + "/" + name + ".png", fullPage: true });
  try {
    await step("the link, followed from another site, opens the interview", async () => {
      // (A page of no origin links to it, as a mail or a chat would: the
      // session's SameSite=Strict cookie must hold all the same.)
      await page.setContent(`<a id="link" href="${link}">the setup link</a>`);
      await page.click("#link");
      await page.locator("#interview-view").waitFor({ state: "visible", timeout: T });
      await page.locator("#q-domains").waitFor({ timeout: T });
      if (new URL(page.url()).search !== "") throw new Error("the token stays in the address: " + page.url());
      const prompt = await page.locator('label[for="q-domains"]').textContent();
      if (!/mail domains/.test(prompt)) throw new Error("the domains question reads " + prompt);
    });
    await shot(page, "interview");

    await step("a change without the CSRF token is refused", async () => {
      const status = await page.evaluate(async (a) => {
        const r = await fetch("/api/setup", { method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ answers: a }) });
        return r.status;
      }, answers);
      if (status !== 403) throw new Error("status " + status);
    });

    await step("a domain that is not one is shown with its reason", async () => {
      await fill(page, { ...answers, domains: "not_a_domain" });
      await page.click("#interview-submit");
      await page.locator("#why-domains", { hasText: "is not a domain" }).waitFor({ timeout: T });
      await page.locator("#interview-error", { hasText: "nothing was enqueued" }).waitFor({ timeout: T });
      if (!(await page.locator("#log-view").isHidden())) throw new Error("the log shows");
    });
    await shot(page, "bad-domain");

    await step("the answers enqueue the tasks", async () => {
      await fill(page, answers);
      await page.click("#interview-submit");
      await page.locator("#log-view").waitFor({ state: "visible", timeout: T });
      await page.locator("#tasks tbody tr.pending").first().waitFor({ timeout: T });
      if (!(await page.locator("#interview-view").isHidden())) throw new Error("the form still shows");
    });
    await shot(page, "enqueued");

    await step("the log lines of pepsi-setup apply appear", async () => {
      await page.locator("#log-summary", { hasText: /^(\d+) of \1 tasks finished\.$/ })
        .waitFor({ timeout: APPLY_T });
      await page.locator("#tasks tbody tr.done td.line", { hasText: "pepsi.conf: written" })
        .waitFor({ timeout: T });
      await page.locator("#tasks tbody tr td.line", { hasText: "._domainkey." + answers.domains })
        .waitFor({ timeout: T });
      const bad = await page.locator("#tasks tbody tr.refused, #tasks tbody tr.failed").count();
      if (bad !== 0) throw new Error(bad + " task(s) refused or failed");
    });
    await shot(page, "applied");

    await step("the link is refused a second time", async () => {
      const other = await browser.newPage();
      const response = await other.goto(link);
      if (response.status() !== 403) throw new Error("status " + response.status());
      await other.locator("body", { hasText: "not valid" }).waitFor({ timeout: T });
      await shot(other, "link-reused");
      await other.close();
    });

    await step("no script error", async () => {
      if (errors.length) throw new Error(errors.join("; "));
    });
    await step("nothing loaded from elsewhere", async () => {
      if (outside.length) throw new Error(outside.join(", "));
    });
  } catch (e) {
    if (errors.length) console.log("# script errors: " + errors.join("; "));
    await shot(page, "failure").catch(() => {});
    await browser.close();
    process.exit(1);
  }
  await browser.close();
})();
