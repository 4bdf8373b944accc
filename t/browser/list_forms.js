// Drives the mailing lists' web forms of pepsi-httpd (/list/form/...) in
// Debian's headless Chromium, through playwright-core, for
// t/170_lists_more.pl:
//
//   node list_forms.js form URL ADDRESS SHOTS     fill the form, submit it
//   node list_forms.js confirm URL - SHOTS        open the mailed link, confirm
//   node list_forms.js serve SHOTS                the same, one per line read
//                                                 ("form URL ADDRESS", "confirm URL -"),
//                                                 each followed by a line "done"
//
// Each run also fails on any console error (a CSP violation is one) and on
// any request that leaves the server.  Prints one line per step ("ok
// <what>" or "fail <what>: <why>") and exits 0, or 1 at the first failure.
// serve starts Chromium once (its start is most of a run's CPU) and gives
// each run a context of its own: no cookie or cache of an earlier run, as a
// browser of its own would; a failed run ends at its first failure, and the
// next line is read.
"use strict";

const { chromium } = require("playwright-core");

const [mode, url, address, shots] = process.argv.slice(2);
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

// One run in a fresh context of browser; true when every step passed.
async function run(browser, mode, url, address, shots) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const base = new URL(url).origin;
  const errors = [];
  const outside = [];
  page.on("pageerror", (e) => errors.push(e.message));
  // (Chromium's own fetch of /favicon.ico, which has none, logs a 404: not the page's.)
  page.on("console", (m) => {
    if (m.type() === "error" && !/^Failed to load resource/.test(m.text())) errors.push(m.text());
  });
  page.on("request", (r) => { if (!r.url().startsWith(base)) outside.push(r.url()); });
  try {
    if (mode === "form") {
      await step("the form opens", async () => {
        await page.goto(url, { timeout: T });
        await page.waitForSelector("#address", { timeout: T });
      });
      await step("submitting an address asks to check the mail", async () => {
        await page.fill("#address", address);
        await Promise.all([page.waitForNavigation({ timeout: T }), page.click("#submit")]);
        const title = await page.textContent("h1");
        if (title !== "Check your mail") throw new Error("the page says " + JSON.stringify(title) + ": " + (await page.textContent("body")));
        await page.screenshot({ path: shots + "/form-" + Date.now() + ".png" });
      });
    } else if (mode === "confirm") {
      await step("the mailed link shows a button", async () => {
        await page.goto(url, { timeout: T });
        await page.waitForSelector("#confirm", { timeout: T });
      });
      await step("the button confirms", async () => {
        await Promise.all([page.waitForNavigation({ timeout: T }), page.click("#confirm")]);
        const title = await page.textContent("h1");
        if (title !== "Done") throw new Error("the page says " + JSON.stringify(title) + ": " + (await page.textContent("body")));
        await page.screenshot({ path: shots + "/confirm-" + Date.now() + ".png" });
      });
    } else {
      await step("a known mode", async () => { throw new Error("no mode " + JSON.stringify(mode)); });
    }
    await step("no console error (no CSP violation) and nothing fetched elsewhere", async () => {
      if (errors.length) throw new Error(errors.join("; "));
      if (outside.length) throw new Error(outside.join(", "));
    });
  } catch (e) {
    await context.close();
    return false;
  }
  await context.close();
  return true;
}

(async () => {
  const browser = await chromium.launch({
    executablePath: executable,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  if (mode !== "serve") {
    const passed = await run(browser, mode, url, address, shots);
    await browser.close();
    process.exit(passed ? 0 : 1);
  }
  const rl = require("readline").createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [m, u, a] = line.split(" ");
    try {
      await run(browser, m, u, a, url);
    } catch (e) {
      console.log("fail the run: " + String(e.message || e).split("\n")[0]);
    }
    console.log("done");
  }
  await browser.close();
})();
