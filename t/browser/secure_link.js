// Drives the secure-link portal in pepsi-httpd (t/178_secure_link.pl) in a
// real browser (Debian's headless Chromium, through playwright-core): the
// notice's link, a code mailed (read from the SMTP peer's directory, as
// the recipient's mailbox), the message with its attachment as a
// download, a reply; no script error, nothing loaded from elsewhere, every
// page under the strict CSP.  A screenshot per view goes to SHOTS.
//
//   node secure_link.js LINK PEER_DIR SHOTS EXPECTED_JSON
//
// Prints one line per step ("ok <what>", or "fail <what>: <why>") and
// exits 0, or 1 at the first failure.
"use strict";

const fs = require("fs");
const { chromium } = require("playwright-core");

const [link, peerDir, shots, expectedJson] = process.argv.slice(2);
const expected = JSON.parse(expectedJson);
const executable = process.env.CHROMIUM || "/usr/bin/chromium";
const base = new URL(link).origin;
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

// The code mailed to the recipient, once the SMTP peer has it (60 s at most).
async function mailedCode() {
  for (let i = 0; i < 600; i++) {
    for (const name of fs.readdirSync(peerDir).filter((n) => /^msg-\d+\.eml$/.test(n))) {
      const text = fs.readFileSync(peerDir + "/" + name, "utf8");
      const m = text.match(/^Subject: Your code for the encrypted message: (\d{8})\r?$/m);
      if (m && text.includes("To: <" + expected.recipient + ">")) return m[1];
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("no code mailed to " + expected.recipient);
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
  page.on("response", (r) => {
    if ((r.headers()["content-type"] || "").startsWith("text/html"))
      policies.push(r.headers()["content-security-policy"] || "");
  });
  const shot = (name) => page.screenshot({ path: shots + "/" + name + ".png", fullPage: true });
  try {
    await step("the notice's link shows what waits", async () => {
      await page.goto(link);
      const text = await page.locator("#waiting").textContent();
      check(text.includes(expected.recipient), "waiting: " + text);
      check(!(await page.content()).includes(expected.text), "the clear text before the code");
      await shot("portal-link");
    });
    await step("a code is mailed", async () => {
      await page.click("#send-code");
      await page.locator("#mailed").waitFor({ timeout: T });
      await shot("portal-code");
    });
    await step("the code opens the message", async () => {
      await page.fill("#code", await mailedCode());
      await page.click("#enter");
      await page.locator("#headers").waitFor({ timeout: T });
      const subject = await page.locator("#subject").textContent();
      check(subject === expected.subject, "subject: " + subject);
      const body = await page.locator("pre.body").first().textContent();
      check(body.includes(expected.text), "body: " + body);
      const cookies = await page.context().cookies();
      const c = cookies.find((x) => x.name === "pepsi_secure");
      check(c && c.httpOnly && c.sameSite === "Strict", "cookie: " + JSON.stringify(c));
      await shot("portal-message");
    });
    await step("the attachment is a download", async () => {
      const a = page.locator("#attachments a");
      check((await a.count()) === 1, "attachments: " + (await a.count()));
      check((await a.textContent()) === expected.attachment, "name: " + (await a.textContent()));
      const response = await page.request.get(base + (await a.getAttribute("href")));
      const h = response.headers();
      check(/^attachment;/.test(h["content-disposition"] || ""), "disposition: " + h["content-disposition"]);
      check((await response.text()) === expected.attachment_text, "content: " + (await response.text()));
    });
    await step("a reply is sent", async () => {
      await page.fill("#reply-body", expected.reply);
      await page.click("#send-reply");
      await page.locator("#replied").waitFor({ timeout: T });
      await shot("portal-reply");
    });
    await step("no script error, nothing loaded from elsewhere, every page under the CSP", async () => {
      check(errors.length === 0, "errors: " + errors.join(" | "));
      check(outside.length === 0, "outside: " + outside.join(" | "));
      check(policies.length >= 4 && policies.every((p) => /default-src 'none'/.test(p)), "a page without the CSP");
    });
  } catch (e) {
    await browser.close();
    process.exit(1);
  }
  await browser.close();
  process.exit(0);
})();
