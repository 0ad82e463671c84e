import { expect, test } from "./fixtures/test";
import { signIn, waitForHydration } from "./fixtures/people";
import { check, putPolicy, recorded, shot } from "./fixtures/api";

// The tasks the dashboard is for, as its people do them: an admin's first look, support
// with "bob says he is blocked", and a delete that asks first. Each runs hydrated and with
// JavaScript off (the two projects), asserts on what a person sees, and keeps a screenshot.

const hour = (name: string, limit: number, dimension: string) => ({
  name,
  algorithm: "fixed_window",
  limit,
  window_ms: 3_600_000,
  dimensions: [dimension],
});

test("an admin's first look: is anything wrong, who is throttled, by which rule", async ({ page }, testInfo) => {
  const policy = `scrape-${testInfo.project.name}`;
  const scraper = `scraper-${testInfo.project.name}`;
  await signIn(page);
  await putPolicy(page, policy, { rules: [hour("per-ip", 2, "ip"), hour("per-user", 1000, "user")] });
  const statuses = [];
  for (let i = 0; i < 5; i++) statuses.push(await check(page, policy, { user: scraper, ip: "192.0.2.66" }));
  expect(statuses).toEqual([200, 200, 429, 429, 429]);

  await page.goto(`/?filter=${policy}`);
  const strip = page.getByRole("list", { name: "Status" });
  await expect(strip).toContainText("Checks");
  await expect(strip).toContainText("Denied, last minute");
  await expect(strip).toContainText("Alerts firing");
  await expect(strip.getByTestId("status-redis")).toContainText("up");
  // The denial's details are written within a second: the page shows them on a reload (or
  // live, hydrated).
  const throttled = page.getByTestId("throttled");
  await expect(async () => {
    if (testInfo.project.name !== "hydrated") await page.reload();
    await expect(throttled).toContainText(`${policy} › per-ip`, { timeout: 1000 });
  }).toPass({ timeout: 10_000 });
  const row = throttled.getByRole("row", { name: new RegExp(`ip=192.0.2.66`) });
  await expect(row).toContainText(`user=${scraper}`);
  await expect(row).toContainText("blocked");
  await expect(row).toContainText("s ago");
  await shot(page, "first-look");
});

test("support: bob says he is blocked; he is, through his address; one reset frees him", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `shop-${testInfo.project.name}`;
  const bob = `bob-${testInfo.project.name}`;
  const ip = hydrated ? "203.0.113.11" : "203.0.113.12";
  await signIn(page);
  await putPolicy(page, policy, { rules: [hour("per-ip", 2, "ip"), hour("per-user", 100, "user")] });
  expect(await check(page, policy, { user: bob, ip })).toBe(200);

  // Support signs in on their own (a signed-in visitor to the sign-in page is sent on).
  await page.context().clearCookies();
  await signIn(page, "e2e-support", "/identifiers");
  if (hydrated) await waitForHydration(page);
  // What support is told is "bob": the inspector finds user=bob. He is not blocked yet.
  // What was checked is written within a second (a busy machine may take longer than the
  // sign-in above): inspecting again reads anew.
  await expect(async () => {
    await page.getByLabel("Identifier or value").fill(bob);
    await page.getByRole("button", { name: "Inspect" }).click();
    await expect(page.getByTestId("verdict")).toContainText("Not blocked", { timeout: 1000 });
  }).toPass({ timeout: 10_000 });
  // Then bob calls again, and is blocked through his address.
  expect(await check(page, policy, { user: bob, ip })).toBe(200);
  expect(await check(page, policy, { user: bob, ip })).toBe(429);
  // The verdict follows live samples, the reset's choices the page's read: inspecting again
  // reads anew, with the address he was checked with (written within a second).
  const what = page.getByLabel("What");
  await expect(async () => {
    await page.getByLabel("Identifier or value").fill(bob);
    await page.getByRole("button", { name: "Inspect" }).click();
    await expect(page.getByTestId("verdict")).toContainText("Blocked now", { timeout: 1000 });
    await expect(what.locator(`option[value="${policy}/per-ip ip=${ip}"]`)).toHaveCount(1, { timeout: 1000 });
    // Over time too: his one check since the first denial was denied.
    await expect(page.getByTestId("steady")).toContainText("Over time: blocked", { timeout: 1000 });
  }).toPass({ timeout: 10_000 });
  // The address is what was asked, as a browser writes it (no `&=` of a nameless button).
  expect(new URL(page.url()).search).toBe(`?id=${bob}`);
  const verdict = page.getByTestId("verdict");
  await expect(verdict).toContainText(`by ${policy} › per-ip on ip=${ip} (checked together with user=${bob})`);
  await expect(verdict).toContainText("the next request passes in");
  await expect(page.getByTestId("companions")).toContainText(`ip=${ip} — blocked by ${policy} › per-ip`);
  await shot(page, "support-bob");

  // The reset's default is what refuses him when the button is pressed (decided then);
  // support resets bob and his address in one go.
  await expect(what).toHaveValue("now");
  await what.selectOption({ label: `user=${bob} and the 1 checked with it: everything` });
  await page.getByRole("region", { name: "Reset" }).getByLabel("Reason").fill("bob's ticket 4711");
  await page.getByRole("button", { name: "Reset counters" }).click();
  const done = page.getByRole("status").filter({ hasText: "Reset done" });
  await expect(done).toContainText("2 keys deleted");
  await expect(page.getByTestId("verdict")).toContainText("Not blocked");
  await shot(page, "support-bob-reset");

  // Reset by mistake? For a minute, the counters can be put back as they were.
  await done.getByRole("button", { name: "Undo (for a minute)" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Reset undone" })).toContainText("2 keys put back");
  await expect(page.getByTestId("verdict")).toContainText("Blocked now");
  expect(await check(page, policy, { user: bob, ip })).toBe(429);
});

test("support gives a partner a limit of its own for a day, right from the inspector", async ({ page }, testInfo) => {
  const policy = `partner-${testInfo.project.name}`;
  const acme = `acme-${testInfo.project.name}`;
  await signIn(page);
  await putPolicy(page, policy, { rules: [hour("per-user", 2, "user")] });
  expect(await check(page, policy, { user: acme })).toBe(200);
  await page.goto(`/identifiers?id=user%3D${acme}`);
  if (testInfo.project.name === "hydrated") await waitForHydration(page);
  const box = page.getByRole("region", { name: "Block, exempt or limit" });
  await expect(box.getByLabel("Policy")).toHaveValue(policy);
  // The limit's fields show once that action is chosen (CSS, so without JavaScript too).
  await expect(box.getByLabel("Requests")).toBeHidden();
  const fill = async (limit: string) => {
    await box.getByLabel("Action").selectOption({ label: "A limit of its own" });
    await box.getByLabel("Requests").fill(limit);
    await box.getByLabel("per", { exact: true }).fill("1");
    await box.getByLabel("Unit").selectOption({ label: "days" });
    await box.getByLabel("For").selectOption({ label: "1 day" });
    await box.getByLabel("Reason").fill("acme's launch, ticket 815");
    await box.getByRole("button", { name: "Add override" }).click();
  };
  await fill("lots");
  await expect(page.getByRole("alert")).toContainText("limit: must be a whole number of requests");
  // It says what it replaces: the policy's own rules.
  await expect(box.getByTestId("own-limit-replaces")).toContainText(`in ${policy} it replaces per-user (limit 2)`);
  await fill("5");
  await expect(page.getByRole("status").filter({ hasText: "Override added" })).toBeVisible();
  // Listed where it acts, with Extend and Remove; the form keeps the unit saved.
  const here = page.getByTestId("overrides-here");
  await expect(here).toContainText(`${policy}: limit: 5 per 1 day`);
  await expect(here.getByRole("button", { name: "Extend by a day" })).toBeVisible();
  await expect(box.getByLabel("Unit")).toHaveValue("d");
  // Counted apart from the policy's 2 an hour: 5 more today, then refused.
  const statuses = [];
  for (let i = 0; i < 6; i++) statuses.push(await check(page, policy, { user: acme }));
  expect(statuses).toEqual([200, 200, 200, 200, 200, 429]);
  await page.goto(`/identifiers?id=user%3D${acme}`);
  await expect(page.getByTestId("verdict")).toContainText(`Blocked now by ${policy} › own-limit on user=${acme}`);
  await shot(page, "own-limit");
  await page.goto(`/policy?name=${policy}`);
  const row = page.getByRole("region", { name: "Overrides" }).getByRole("row", { name: `user=${acme}` });
  await expect(row).toContainText("limit: 5 per 1 day");
  await expect(row).toContainText("acme's launch, ticket 815");
  // And taken away again, after a second step, saying so.
  await row.getByText("Remove…").click();
  await row.getByRole("button", { name: "Yes, remove it" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Override removed." })).toBeVisible();
  await expect(page.getByRole("region", { name: "Overrides" }).getByRole("row", { name: `user=${acme}` })).toHaveCount(0);
});

test("deleting a policy states what it touches and takes its name typed", async ({ page }, testInfo) => {
  const policy = `doomed-${testInfo.project.name}`;
  await signIn(page);
  await putPolicy(page, policy, { rules: [hour("per-user", 5, "user")] });
  for (let i = 0; i < 3; i++) await check(page, policy, { user: "1" });
  await page.goto(`/policy?name=${policy}`);
  if (testInfo.project.name === "hydrated") await waitForHydration(page);
  const box = page.getByTestId("delete");
  await box.getByText("Delete this policy…").click();
  await expect(box).toContainText(`${policy} answered 3 checks in the last minute`);
  await expect(box).toContainText("refused as an unknown policy (404)");
  await box.getByLabel(`Type ${policy} to confirm`).fill(policy);
  await shot(page, "delete-confirm");
  await box.getByRole("button", { name: "Delete policy" }).click();
  await expect(page.getByRole("status")).toContainText(`Deleted policy ${policy}.`);
  await expect(page.locator('table[data-testid^="policies"]', { hasText: policy })).toHaveCount(0);
  await shot(page, "deleted");
});

test("a policy's page says how many checks matched no rule in the last hour", async ({ page }, testInfo) => {
  const policy = `unmatched-${testInfo.project.name}`;
  await signIn(page);
  await putPolicy(page, policy, { strict: false, rules: [hour("per-user", 5, "user")] });
  expect(await check(page, policy, { user: "1" })).toBe(200);
  // A typo'd dimension: no rule counts it, so it is let through uncounted.
  for (let i = 0; i < 2; i++) expect(await check(page, policy, { usr: "1" })).toBe(200);
  const traffic = page.getByTestId("traffic");
  await expect(async () => {
    await page.goto(`/policy?name=${policy}`);
    await expect(traffic).toContainText("3 checks", { timeout: 500 });
  }).toPass({ timeout: 10_000 });
  await expect(traffic).toContainText("2 matched no rule");
  await expect(traffic).toContainText("let through uncounted");
  await shot(page, "unmatched");
});

test("a misspelt dimension beside a correct one shows on the overview's strip and the policy's page", async ({ page }, testInfo) => {
  const policy = `typo-${testInfo.project.name}`;
  await signIn(page);
  await putPolicy(page, policy, { rules: [hour("per-user", 100, "user"), hour("per-ip", 100, "ip")] });
  // `usr` for `user`: refused by the strict policy, naming it.
  expect(await check(page, policy, { ip: "192.0.2.90", usr: "bob" })).toBe(400);
  // The page says what was sent (written within a second); the overview's strip counts such
  // checks of every policy and links to the one with most (other specs' policies may lead).
  const note = page.getByTestId("unused-dimensions");
  // (No fragment here: a second goto of the same address and fragment does not reload.)
  await expect(async () => {
    await page.goto(`/policy?name=${policy}`);
    await expect(note).toContainText("sent a dimension no rule counts: usr (1)", { timeout: 500 });
  }).toPass({ timeout: 10_000 });
  await page.goto("/");
  const strip = page.locator('a:has([data-testid="status-unused"])');
  await expect(strip).toContainText("Sent a dimension no rule counts");
  await expect(strip).toHaveAttribute("href", /^\/policy\?name=.+#unused$/);
  await page.goto(`/policy?name=${policy}#unused`);
  await expect(page.getByTestId("unused-dimensions")).toContainText("refused with 400");
  await shot(page, "unused");
});

test("an admin halves a limit, sees whom it would have throttled, and backs out unsaved", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `halved-${testInfo.project.name}`;
  await signIn(page);
  await putPolicy(page, policy, { rules: [hour("per-user", 4, "user")] });
  for (const who of ["heavy", "heavy", "heavy", "heavy", "light"]) expect(await check(page, policy, { user: who })).toBe(200);
  await recorded(page, policy, 5);
  await page.goto(`/policy?name=${policy}`);
  if (hydrated) await waitForHydration(page);
  await page.getByRole("group", { name: "Rule per-user" }).getByLabel("Limit").fill("2");
  await page.getByRole("button", { name: "What would this do?" }).click();
  const answer = page.getByTestId("what-if");
  await expect(answer).toContainText("Over 5 recorded checks");
  await expect(answer).toContainText("2 that were let through would be denied");
  await expect(page.getByTestId("newly-throttled")).toContainText("user=heavy: 2 checks");
  // What was typed stays in the editor; nothing was saved.
  await expect(page.getByRole("group", { name: "Rule per-user" }).getByLabel("Limit")).toHaveValue("2");
  await expect(page.getByRole("heading", { level: 2, name: "Version 1" })).toBeVisible();
  // A suggested limit goes into the form and is replayed: 1 an hour throttles the heavy user only.
  await page.getByTestId("suggested-limits").first().getByRole("link", { name: "Use 1" }).click();
  await expect(answer).toContainText("3 that were let through would be denied");
  await expect(page.getByRole("group", { name: "Rule per-user" }).getByLabel("Limit")).toHaveValue("1");
  // Over the last day too.
  await answer.getByRole("link", { name: "The last day" }).click();
  await expect(page.getByRole("heading", { name: "What would this do? The last day, replayed" })).toBeVisible();
  await expect(answer).toContainText("3 that were let through would be denied");
  await shot(page, "what-if");
  // Backing out: the stored policy is as it was.
  await page.goto(`/policy?name=${policy}`);
  await expect(page.getByRole("group", { name: "Rule per-user" }).getByLabel("Limit")).toHaveValue("4");
  await expect(page.getByTestId("what-if")).toHaveCount(0);
});

test("an admin gives a rule a penalty box in the editor; the preview and the inspector show it", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `boxed-${testInfo.project.name}`;
  await signIn(page);
  await page.goto(`/policy?name=${policy}`);
  if (hydrated) await waitForHydration(page);
  const rule = page.getByRole("group", { name: "Add a rule" }).first();
  await rule.getByLabel("Name").fill("per-minute");
  // A bucket that refills a token an hour: no window turns between the checks below, however
  // slow the machine.
  await rule.getByLabel("Algorithm").selectOption("token_bucket");
  await rule.getByLabel("Capacity").fill("2");
  await rule.getByLabel("Tokens per period").fill("1");
  await rule.getByLabel("Period", { exact: true }).fill("1");
  await rule.getByLabel("Period unit").selectOption("h");
  await rule.getByLabel("Once it denies, block for").fill("10");
  await rule.getByLabel("Block unit").selectOption("min");
  // Waiting instead of refusing, with no time given first: named beside its field, and
  // what was typed stays.
  await page.getByLabel("Wait instead of refusing").check();
  await page.getByRole("button", { name: "Save policy" }).click();
  await expect(page.getByTestId("save-error")).toContainText("Hold a denied request at most");
  await expect(page.getByLabel("Wait instead of refusing")).toBeChecked();
  await expect(page.getByRole("group", { name: "Rule per-minute" }).getByLabel("Once it denies, block for")).toHaveValue("10");
  await page.getByLabel("Hold a denied request at most (ms)").fill("2000");
  await page.getByRole("button", { name: "Save policy" }).click();
  await expect(page.getByRole("heading", { level: 2, name: "Version 1" })).toBeVisible();
  await expect(page.getByLabel("Wait instead of refusing")).toBeChecked();
  await expect(page.getByLabel("Hold a denied request at most (ms)")).toHaveValue("2000");
  const saved = page.getByRole("group", { name: "Rule per-minute" });
  await expect(saved.getByLabel("Once it denies, block for")).toHaveValue("10");
  await expect(saved.getByLabel("Block unit")).toHaveValue("min");
  await expect(saved).toContainText("once it denies, the identifier is blocked for 10 minutes");
  await expect(page.getByTestId("preview")).toContainText("2 allowed, 48 denied");
  await expect(page.getByTestId("preview")).toContainText("48 of them while its penalty box held the identifier");

  for (let i = 0; i < 2; i++) expect(await check(page, policy, { user: "eve" })).toBe(200);
  expect(await check(page, policy, { user: "eve" })).toBe(429);
  await page.goto(`/identifiers?id=${encodeURIComponent("user=eve")}`);
  const verdict = page.getByTestId("verdict");
  await expect(verdict).toContainText(`Blocked now by ${policy} › per-minute on user=eve`);
  await expect(verdict).toContainText("a penalty of 10.0 min after the rule denied");
  await expect(page.getByRole("region", { name: `user=eve in ${policy}` })).toContainText("penalty box: blocked for 10.0 min after a denial");
  await shot(page, "penalty");
});

test("an admin counts a hot rule on each instance; the inspector marks it approximate", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `hot-${testInfo.project.name}`;
  await signIn(page);
  await page.goto(`/policy?name=${policy}`);
  if (hydrated) await waitForHydration(page);
  const rule = page.getByRole("group", { name: "Add a rule" }).first();
  await rule.getByLabel("Name").fill("per-user");
  await rule.getByLabel("Algorithm").selectOption("fixed_window");
  await rule.getByLabel("Limit").fill("1000");
  await rule.getByLabel("Window", { exact: true }).fill("1");
  await rule.getByLabel("Window unit").selectOption("h");
  await rule.getByLabel("Counted").selectOption("local");
  // Too short a flush: named beside its field, and what was typed stays.
  await rule.getByLabel("Flush every (ms)").fill("5");
  await page.getByRole("button", { name: "Save policy" }).click();
  await expect(page.getByTestId("save-error")).toContainText("Flush every (ms)");
  await expect(page.getByTestId("save-error")).toContainText("from 10 to 60000");
  const typed = page.getByRole("group", { name: "Rule per-user" });
  await expect(typed.getByLabel("Counted")).toHaveValue("local");
  await typed.getByLabel("Flush every (ms)").fill("250");
  await page.getByRole("button", { name: "Save policy" }).click();
  await expect(page.getByRole("heading", { level: 2, name: "Version 1" })).toBeVisible();
  const saved = page.getByRole("group", { name: "Rule per-user" });
  await expect(saved.getByLabel("Counted")).toHaveValue("local");
  await expect(saved.getByLabel("Flush every (ms)")).toHaveValue("250");
  await expect(saved).toContainText("counted on each instance and flushed to Redis every 250 ms");

  expect(await check(page, policy, { user: "zed" })).toBe(200);
  // Counted by the instance, in Redis within a flush: what the inspector reads.
  await expect
    .poll(async () => {
      const inspection = await (await page.request.get("/api/v1/identifiers/user/zed")).json();
      const mine = inspection.policies.find((p: { policy: string }) => p.policy === policy);
      return mine?.rules?.[0]?.remaining;
    })
    .toBe(999);
  await page.goto(`/identifiers?id=${encodeURIComponent("user=zed")}`);
  const row = page.getByRole("region", { name: `user=zed in ${policy}` });
  await expect(row).toContainText("1 / 1000");
  await expect(row.getByTestId("approximate-per-user")).toHaveText("approximate (local, flushed every 250 ms)");
  await expect(row.getByTestId("approximate-per-user")).toBeVisible();
  await expect(row.getByTestId("approximate-per-user")).toHaveCSS("background-color", /rgb\(/);
  await shot(page, "local");
});

test("the overview hydrates within 2 s on a Slow 4G connection", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name !== "hydrated", "hydration needs JavaScript");
  await signIn(page);
  // The moment of hydration on the page's own clock (milliseconds since the navigation
  // started, before the HTML was asked for): the app marks <body> when it has hydrated. Timed
  // around Playwright's calls instead, the figure also held their round trips and polling,
  // about 0.3 s here.
  await page.addInitScript(() => {
    new MutationObserver((_, observer) => {
      if (document.body?.dataset.hydrated) {
        (window as unknown as { hydratedAt: number }).hydratedAt = performance.now();
        observer.disconnect();
      }
    }).observe(document, { attributes: true, subtree: true, attributeFilter: ["data-hydrated"] });
  });
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.setCacheDisabled", { cacheDisabled: true });
  // Chrome's "Slow 4G" preset: 1.6 Mbit/s down, 750 kbit/s up, 150 ms.
  await cdp.send("Network.emulateNetworkConditions", {
    offline: false,
    latency: 150,
    downloadThroughput: (1.6 * 1024 * 1024) / 8,
    uploadThroughput: (750 * 1024) / 8,
  });
  let bytes = 0;
  cdp.on("Network.loadingFinished", (e) => (bytes += e.encodedDataLength));
  await page.goto("/", { waitUntil: "commit" });
  await waitForHydration(page);
  const timing = await page.evaluate(() => ({
    hydrated: (window as unknown as { hydratedAt: number }).hydratedAt,
    wasm: performance.getEntriesByType("resource").find((e) => e.name.endsWith(".wasm"))?.responseEnd,
  }));
  const ms = Math.round(timing.hydrated);
  const wasm = Math.round(timing.wasm ?? NaN);
  testInfo.annotations.push({
    type: "slow-4g",
    description: `hydrated at ${ms} ms (wasm received at ${wasm} ms), ${bytes} bytes`,
  });
  console.log(`slow 4G: hydrated at ${ms} ms, the wasm received at ${wasm} ms, ${bytes} bytes`);
  // Most of the time is what crosses the wire first (at 1.6 Mbit/s, 200 KB take a second):
  // held to a budget. What follows the wasm's last byte (compiling, hydrating) takes about
  // 20 ms here.
  expect(bytes).toBeLessThan(320 * 1024);
  expect(wasm).toBeGreaterThan(0);
  expect(ms).toBeGreaterThanOrEqual(wasm);
  expect(ms).toBeLessThan(2000);
});

test("every page loads within 1.5 s at 400 kbit/s once its files are cached", async ({ page }, testInfo) => {
  test.skip(testInfo.project.name !== "hydrated", "a warm load is the browser's cache at work");
  await signIn(page);
  const pages = ["/", "/history", "/identifiers?id=user%3Dbob", "/policies", "/audit", "/alerts", "/people", "/account"];
  // Warm: each page once at full speed, so its wasm, JS and CSS are cached (a year's caching).
  for (const path of pages) {
    await page.goto(path);
    await waitForHydration(page);
  }
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.emulateNetworkConditions", {
    offline: false,
    latency: 150,
    downloadThroughput: (400 * 1024) / 8,
    uploadThroughput: (400 * 1024) / 8,
  });
  const seen: string[] = [];
  for (const path of pages) {
    await page.goto(path);
    await waitForHydration(page);
    // On the page's own clock: from the navigation's start to the app hydrated.
    const ms = Math.round(
      await page.evaluate(() => {
        const nav = performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming;
        return Math.max(nav.loadEventEnd, nav.domContentLoadedEventEnd);
      }),
    );
    seen.push(`${path} ${ms} ms`);
  }
  console.log(`400 kbit/s, warm: ${seen.join(", ")}`);
  testInfo.annotations.push({ type: "400-kbit-warm", description: seen.join(", ") });
  for (const line of seen) expect(Number(line.split(" ")[1]), line).toBeLessThan(1500);
});
