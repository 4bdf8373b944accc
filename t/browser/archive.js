// Drives a list's public archive in pepsi-httpd (t/169_list_archive.pl) in
// a real browser (Debian's headless Chromium, through playwright-core):
// the months, a month's threads, a thread as a tree, a message with its
// attachment as a download link, search; no script error, nothing loaded
// from elsewhere, every page under the strict CSP.  A screenshot per view
// goes to SHOTS.
//
//   node archive.js BASE LIST SHOTS EXPECTED_JSON
//
// First, with the login link mailed to the list's owner (expected.link), of
// a list whose archive is private: the link's button logs in, the archive
// shows, the members page lists the members, the moderation page approves
// the held post (a form with the session's CSRF token).
//
// Prints one line per step ("ok <what>", or "fail <what>: <why>") and
// exits 0, or 1 at the first failure.
"use strict";

const { chromium } = require("playwright-core");

const [base, list, shots, expectedJson] = process.argv.slice(2);
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

function check(condition, why) {
  if (!condition) throw new Error(why);
}

(async () => {
  const browser = await chromium.launch({
    executablePath: executable,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  const errors = [];
  const outside = [];
  const policies = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && !/^Failed to load resource/.test(m.text())) errors.push(m.text());
  });
  page.on("request", (r) => { if (!r.url().startsWith(base)) outside.push(r.url()); });
  page.on("response", (r) => policies.push(r.headers()["content-security-policy"] || ""));
  const shot = (name) => page.screenshot({ path: shots + "/" + name + ".png", fullPage: true });
  const root = base + "/archive/" + list + "/";
  try {
    await step("the mailed link logs the owner in", async () => {
      await page.goto(expected.link);
      await shot("archive-login");
      await page.click("#enter");
      await page.locator("#months").waitFor({ timeout: T });
      const cookies = await page.context().cookies();
      const c = cookies.find((x) => x.name === "pepsi_archive");
      check(c && c.httpOnly && c.sameSite === "Strict", "cookie: " + JSON.stringify(c));
    });
    await step("the members page lists the members", async () => {
      await page.goto(root + "members");
      const rows = await page.locator("#members tbody tr").allTextContents();
      check(rows.some((r) => r.includes(expected.member)), "members: " + rows.join(" | "));
      await shot("archive-members");
    });
    await step("the moderation page approves the held post", async () => {
      await page.goto(root + "moderation");
      check((await page.locator("#held li").count()) === 1, "held: " + (await page.locator("#held").textContent()));
      await shot("archive-moderation");
      await page.click("#held button.approve");
      await page.locator("#held-count").waitFor({ timeout: T });
      const count = await page.locator("#held-count").textContent();
      check(count === "0 held", "after approving: " + count);
    });
    await step("the months of the archive", async () => {
      await page.goto(root);
      const months = await page.locator("#months li").allTextContents();
      check(months.some((m) => m.includes(expected.month_name)), "months: " + months.join(" | "));
      await shot("archive-months");
    });
    await step("a month lists its threads", async () => {
      await page.click("#months a");
      await page.locator("#threads").waitFor({ timeout: T });
      const threads = await page.locator("#threads li").allTextContents();
      check(threads.some((t) => t.includes(expected.thread_subject)), "threads: " + threads.join(" | "));
      await shot("archive-month");
    });
    await step("a thread shows its replies nested", async () => {
      await page.click("#threads a:text-is('" + expected.thread_subject + "')");
      await page.locator("#thread").waitFor({ timeout: T });
      const nested = await page.locator("#thread ul ul ul li").count();
      check(nested >= 1, "no third level in the thread");
      await shot("archive-thread");
    });
    await step("a message shows its text, its sender obfuscated", async () => {
      await page.click("#thread a >> nth=0");
      await page.locator("#text").waitFor({ timeout: T });
      const text = await page.locator("#text").textContent();
      check(text.includes(expected.root_text), "text: " + text);
      const from = await page.locator("#from").textContent();
      check(!from.includes("@"), "from shows an address: " + from);
      await shot("archive-message");
    });
    await step("an attachment is a download, never a page", async () => {
      await page.goto(root + "message/" + expected.attachment_message);
      const link = page.locator("#attachments a");
      check((await link.count()) === 1, "no attachment link");
      const href = await link.getAttribute("href");
      const response = await page.request.get(base + href);
      const h = response.headers();
      check(/^attachment;/.test(h["content-disposition"] || ""), "disposition: " + h["content-disposition"]);
      check(h["x-content-type-options"] === "nosniff", "no nosniff");
      check(/sandbox/.test(h["content-security-policy"] || ""), "csp: " + h["content-security-policy"]);
      await shot("archive-attachment-message");
    });
    await step("search finds a word of a body", async () => {
      await page.goto(root);
      await page.fill("#q", expected.body_word);
      await page.click("#search");
      await page.locator("#results").waitFor({ timeout: T });
      check((await page.locator("#results li").count()) === 1, "results: " + (await page.locator("#results").textContent()));
      await shot("archive-search");
    });
    await step("no script error, nothing loaded from elsewhere, every page under the CSP", async () => {
      check(errors.length === 0, "errors: " + errors.join(" | "));
      check(outside.length === 0, "outside: " + outside.join(" | "));
      check(policies.every((p) => /default-src 'none'/.test(p)), "a page without the CSP");
    });
  } catch (e) {
    await browser.close();
    process.exit(1);
  }
  await browser.close();
  process.exit(0);
})();
