import { type Page } from "@playwright/test";
import { expect, test } from "./fixtures/test";
import { E2E_SERVICE_KEY, signIn, waitForHydration } from "./fixtures/people";

/** Saves a full-page screenshot as a test artifact. */
async function shot(page: Page, name: string) {
  await page.screenshot({ path: test.info().outputPath(`${name}.png`), fullPage: true });
}

test("create a policy, throttle someone, see it live, inspect, reset with a reason, audit it", async ({
  page,
  request,
}, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  // Both projects share one server: names of their own.
  const policy = `e2e-${testInfo.project.name}`;
  const user = `mallory-${testInfo.project.name}`;

  await signIn(page);

  // Create the policy in the editor.
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Policies" }).click();
  await page.getByLabel("New policy name").fill(policy);
  await page.getByRole("button", { name: "Create" }).click();
  await expect(page.getByRole("heading", { level: 1, name: `New policy ${policy}` })).toBeVisible();
  if (hydrated) await waitForHydration(page);
  const rule = page.getByRole("group", { name: "Add a rule" }).first();
  await rule.getByLabel("Name").fill("per-hour");
  await rule.getByLabel("Algorithm").selectOption("fixed_window");
  await rule.getByLabel("Limit").fill("0");
  await rule.getByLabel("Window", { exact: true }).fill("1");
  await rule.getByLabel("Window unit").selectOption("h");
  await page.getByLabel("Description").fill("three an hour, from the browser test");
  await page.getByRole("button", { name: "Save policy" }).click();
  // A bad value is named beside its field, and at the top under its label; what was typed
  // stays (with and without JavaScript).
  const typed = page.getByRole("group", { name: "Rule per-hour" });
  await expect(typed.locator("label", { hasText: "Limit" }).getByRole("alert")).toHaveText(
    "must be between 1 and 1000000000",
  );
  await expect(page.getByTestId("save-error")).toContainText("Rule 1 (per-hour) › Limit: must be between 1 and 1000000000");
  await expect(typed.getByLabel("Window", { exact: true })).toHaveValue("1");
  await expect(typed.getByLabel("Window unit")).toHaveValue("h");
  await expect(page.getByLabel("Description")).toHaveValue("three an hour, from the browser test");
  await typed.getByLabel("Limit").fill("3");
  await page.getByRole("button", { name: "Save policy" }).click();
  await expect(page.getByRole("heading", { level: 2, name: "Version 1" })).toBeVisible();
  await expect(page.getByTestId("preview")).toContainText("50 requests: 3 allowed, 47 denied");
  // Another burst: hydrated, the editor's code (loaded on demand) computes it in the browser
  // without a page load; without JavaScript the form asks the server.
  if (hydrated) {
    await waitForHydration(page);
    await page.evaluate(() => ((window as any).__noReload = "editor"));
  }
  await page.getByRole("textbox", { name: "Requests" }).fill("10");
  await page.getByRole("button", { name: "Preview" }).click();
  await expect(page.getByTestId("preview")).toContainText("10 requests: 3 allowed, 7 denied");
  if (hydrated) expect(await page.evaluate(() => (window as any).__noReload)).toBe("editor");
  await shot(page, "policy");

  // The overview, open before the traffic starts.
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Overview" }).click();
  await expect(page.getByRole("heading", { level: 1, name: "Overview" })).toBeVisible();
  if (hydrated) {
    await waitForHydration(page);
    await page.evaluate(() => ((window as any).__noReload = "still here"));
  }

  // Traffic through the check API: 3 allowed, then denials.
  const statuses: number[] = [];
  for (let i = 0; i < 8; i++) {
    const r = await request.post("/api/v1/check", {
      headers: { Authorization: `Bearer ${E2E_SERVICE_KEY}` },
      data: { policy, identifiers: { user } },
    });
    statuses.push(r.status());
  }
  expect(statuses).toEqual([200, 200, 200, 429, 429, 429, 429, 429]);

  const throttled = page.getByTestId("throttled");
  if (hydrated) {
    // Live: no reload, within 2 seconds.
    await expect(throttled).toContainText(`user=${user}`, { timeout: 2000 });
    expect(await page.evaluate(() => (window as any).__noReload)).toBe("still here");
    await expect(page.getByTestId(`rate-${policy}`)).toBeVisible();
  } else {
    await page.reload();
    await expect(throttled).toContainText(`user=${user}`);
  }
  await shot(page, "overview");

  // Inspect the identifier from the overview.
  await throttled.getByRole("link", { name: `user=${user}` }).click();
  await expect(page.getByRole("heading", { level: 1, name: "Identifier inspector" })).toBeVisible();
  const card = page.getByRole("region", { name: `user=${user} in ${policy}` });
  await expect(card.getByTestId(`used-${policy}-per-hour`)).toHaveText("3 / 3");
  await expect(card).toContainText("blocks");
  await expect(page.getByTestId("verdict")).toContainText(`Blocked now by ${policy} › per-hour on user=${user}`);
  if (hydrated) await waitForHydration(page);
  await shot(page, "inspector");

  // Reset that policy for it, with a reason.
  // The reset's default is what refuses it when the button is pressed; each rule is offered.
  await expect(page.getByLabel("What")).toHaveValue("now");
  await expect(page.getByLabel("What").locator(`option[value="${policy}/per-hour user=${user}"]`)).toHaveCount(1);
  await page.getByLabel("What").selectOption({ label: `user=${user}: policy ${policy}` });
  await page.getByRole("region", { name: "Reset" }).getByLabel("Reason").fill("false positive, ticket 42");
  await page.getByRole("button", { name: "Reset counters" }).click();
  // Nothing left of it there: the policy joins those where it has no state.
  await expect(page.getByTestId("untouched")).toContainText(policy);
  await expect(card).toHaveCount(0);

  // The audit log has it.
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Audit" }).click();
  await page.getByLabel("Action").selectOption({ label: "reset" });
  await page.getByRole("button", { name: "Filter" }).click();
  const row = page.getByTestId("audit").getByRole("row", { name: new RegExp(`user=${user}`) });
  await expect(row).toContainText("false positive, ticket 42");
  await expect(row).toContainText("user:e2e-admin");
  await shot(page, "audit");

  // The remaining pages, for the record.
  await page.goto("/policies");
  // Busy or idle (folded), it is listed.
  await expect(page.locator('table[data-testid^="policies"]', { hasText: policy })).toHaveCount(1);
  await shot(page, "policies");
  await page.goto("/people");
  await expect(page.getByRole("heading", { level: 1, name: "Users and API keys" })).toBeVisible();
  await shot(page, "people");
});

test("a user that cannot be added keeps what was typed, and one that can clears the form", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  await signIn(page, "e2e-admin", "/people");
  if (hydrated) await waitForHydration(page);
  const users = page.locator("#new-user");
  await users.getByLabel("User name").fill("Support Sam");
  await users.getByLabel("Role").selectOption("support");
  await users.getByLabel("Password (12 or more characters)").fill("a password long enough");
  await users.getByRole("button", { name: "Add user" }).click();
  await expect(page.getByRole("alert").first()).toContainText("must be 1 to 64 lowercase letters");
  // What was typed is still there (the password is asked for again without JavaScript).
  await expect(users.getByLabel("User name")).toHaveValue("Support Sam");
  await expect(users.getByLabel("Role")).toHaveValue("support");
  await shot(page, "user-refused");
  const name = `sam-${testInfo.project.name}`;
  await users.getByLabel("User name").fill(name);
  await users.getByLabel("Password (12 or more characters)").fill("a password long enough");
  await users.getByRole("button", { name: "Add user" }).click();
  await expect(page.getByRole("status")).toContainText("User added.");
  await expect(page.getByRole("row", { name: new RegExp(name) })).toContainText("support");
  await expect(users.getByLabel("User name")).toHaveValue("");
});

test("an admin creates an API key, sees it once, and revokes it", async ({ page, request }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  await signIn(page, "e2e-admin", "/people");
  if (hydrated) await waitForHydration(page);
  const name = `e2e key ${testInfo.project.name}`;
  const keys = page.getByRole("region", { name: "API keys" });
  await keys.getByLabel("Name").fill(name);
  await keys.getByRole("button", { name: "Create key" }).click();
  const secret = (await page.getByTestId("new-key").textContent())!.trim();
  expect(secret).toMatch(/^spw_svc_[0-9a-f]{64}$/);
  const check = () =>
    request.post("/api/v1/check", {
      headers: { Authorization: `Bearer ${secret}` },
      data: { policy: "demo", identifiers: { user: "1" } },
    });
  await expect.poll(async () => (await check()).status(), { timeout: 2000 }).toBe(200);
  await page.reload();
  await expect(page.getByTestId("new-key")).toHaveCount(0);
  // Nothing destructive on one click: the row asks first.
  await page.getByRole("row", { name: new RegExp(name) }).getByText("Revoke…").click();
  await page.getByRole("button", { name: `Revoke ${name}` }).click();
  await expect(page.getByRole("row", { name: new RegExp(name) })).toContainText("revoked");
  await expect.poll(async () => (await check()).status(), { timeout: 1500 }).toBe(401);
});
