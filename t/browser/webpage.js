// Drives pepsi-httpd's web page in a real browser (Debian's headless
// Chromium, through playwright-core), as an administrator would: log in,
// find a queued message, hold it, release it, and watch the pipeline's
// counts follow.  Called by t/093_httpd_browser.pl:
//
//   node webpage.js BASE_URL NAME PASSWORD MESSAGE_ID SCREENSHOT
//
// Prints one line per step ("ok <what>") and exits 0, or prints
// "fail <what>: <why>" and exits 1.
"use strict";

const { chromium } = require("playwright-core");

const [base, name, password, messageId, screenshot] = process.argv.slice(2);
const executable = process.env.CHROMIUM || "/usr/bin/chromium";

async function step(what, action) {
  try {
    await action();
    console.log("ok " + what);
  } catch (e) {
    console.log("fail " + what + ": " + String(e.message || e).split("\n")[0]);
    throw e;
  }
}

(async () => {
  const browser = await chromium.launch({
    executablePath: executable,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  // (A refused request, such as the 401 of a wrong password or of the
  // session check before login, is reported as a console error too: it is
  // the page's business, not an error of its script.)
  page.on("console", (m) => {
    if (m.type() === "error" && !/^Failed to load resource/.test(m.text())) errors.push(m.text());
  });
  const row = () => page.locator(`#queue tbody tr[data-id="${messageId}"]`);
  // Each view has its address (#overview, #queue, #message/ID...).
  const show = async (view) => {
    await page.evaluate((v) => { location.hash = v; }, view);
    await page.locator("#view-" + view).waitFor({ state: "visible", timeout: 10000 });
  };
  const held = (stage) => page.locator(`#pipeline tbody tr[data-stage="${stage}"] td.held`);
  try {
    await step("the page asks for a login", async () => {
      await page.goto(base + "/");
      await page.locator("#login-view").waitFor({ state: "visible", timeout: 10000 });
    });
    await step("a wrong password is refused on the page", async () => {
      await page.fill("#login-name", name);
      await page.fill("#login-password", "not the password");
      await page.click("#login-submit");
      await page.locator("#login-error", { hasText: "wrong name or password" }).waitFor({ timeout: 10000 });
    });
    await step("the right password logs in", async () => {
      await page.fill("#login-password", password);
      await page.click("#login-submit");
      await page.locator("#main-view").waitFor({ state: "visible", timeout: 10000 });
      const who = await page.textContent("#who");
      if (who !== name) throw new Error("the page says it is " + who);
    });
    let stage;
    await step("the queued message is listed", async () => {
      await show("queue");
      await row().waitFor({ timeout: 15000 });
      stage = await row().locator("td").nth(2).textContent();
      const status = await row().locator("td.status").textContent();
      if (status !== "pending") throw new Error("status " + status);
    });
    await step("the pipeline shows its stage with nothing held", async () => {
      await show("overview");
      await page.locator(`#pipeline tbody tr[data-stage="${stage}"]`).waitFor({ timeout: 10000 });
      const count = await held(stage).textContent();
      if (count !== "0") throw new Error("held " + count);
    });
    await step("hold", async () => {
      await show("queue");
      await row().locator("input[type=checkbox]").check();
      await page.click('#queue-actions button[data-action="hold"]');
      await page.locator("#action-result", { hasText: "hold: 1 of 1" }).waitFor({ timeout: 10000 });
      await page.locator(`#queue tbody tr[data-id="${messageId}"] td.status`, { hasText: "held" })
        .waitFor({ timeout: 10000 });
    });
    await step("the pipeline's held count follows", async () => {
      await show("overview");
      await page.waitForFunction((s) => {
        const cellHeld = document.querySelector(`#pipeline tbody tr[data-stage="${s}"] td.held`);
        return cellHeld && cellHeld.textContent === "1";
      }, stage, { timeout: 10000 });
    });
    await step("release", async () => {
      await show("queue");
      await row().locator("input[type=checkbox]").check();
      await page.click('#queue-actions button[data-action="release"]');
      await page.locator("#action-result", { hasText: "release: 1 of 1" }).waitFor({ timeout: 10000 });
      await page.locator(`#queue tbody tr[data-id="${messageId}"] td.status`, { hasText: "pending" })
        .waitFor({ timeout: 10000 });
      await show("overview");
      await page.waitForFunction((s) => {
        const cellHeld = document.querySelector(`#pipeline tbody tr[data-stage="${s}"] td.held`);
        return cellHeld && cellHeld.textContent === "0";
      }, stage, { timeout: 10000 });
    });
    await step("the message's details open", async () => {
      await show("queue");
      await row().locator("a").click();
      await page.locator("#message-headers", { hasText: "Subject: browser test" }).waitFor({ timeout: 10000 });
    });
    await step("no script error", async () => {
      if (errors.length) throw new Error(errors.join("; "));
    });
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
    await step("log out", async () => {
      await page.click("#logout");
      await page.locator("#login-view").waitFor({ state: "visible", timeout: 10000 });
    });
  } catch (e) {
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
    await browser.close();
    process.exit(1);
  }
  await browser.close();
})();
