import { expect, test } from "./fixtures/test";
import { E2E_SERVICE_KEY, signIn, waitForHydration } from "./fixtures/people";

test("a concurrency rule made in the editor holds a lease the inspector shows and releases", async ({ page, request }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `exports-${testInfo.project.name}`;
  const customer = `acme-${testInfo.project.name}`;
  await signIn(page);

  // The editor: a concurrency rule, with its own fields.
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Policies" }).click();
  await page.getByLabel("New policy name").fill(policy);
  await page.getByRole("button", { name: "Create" }).click();
  await expect(page.getByRole("heading", { level: 1, name: `New policy ${policy}` })).toBeVisible();
  if (hydrated) await waitForHydration(page);
  const rule = page.getByRole("group", { name: "Add a rule" }).first();
  await rule.getByLabel("Name").fill("running");
  await rule.getByLabel("Algorithm").selectOption("concurrency");
  await expect(rule.getByLabel("Lease", { exact: true })).toBeVisible();
  await expect(rule.getByLabel("Window", { exact: true })).toBeHidden();
  await rule.getByLabel("Limit").fill("2");
  await rule.getByLabel("Lease", { exact: true }).fill("10");
  await rule.getByLabel("Lease unit").selectOption("min");
  await page.getByRole("button", { name: "Save policy" }).click();
  await expect(page.getByRole("heading", { level: 2, name: "Version 1" })).toBeVisible();
  // A burst that never finishes: two get a lease.
  await expect(page.getByTestId("preview")).toContainText("50 requests: 2 allowed, 48 denied");

  // A lease held through the API.
  const check = await request.post("/api/v1/check", {
    headers: { Authorization: `Bearer ${E2E_SERVICE_KEY}` },
    data: { policy, identifiers: { customer } },
  });
  expect(check.status()).toBe(200);
  const lease: string = (await check.json()).results[0].lease;
  expect(lease).toBeTruthy();

  // The inspector shows it, and support releases it with a reason.
  await page.goto(`/identifiers?id=${encodeURIComponent(`customer=${customer}`)}`);
  await expect(page.getByRole("heading", { level: 1, name: "Identifier inspector" })).toBeVisible();
  if (hydrated) await waitForHydration(page);
  const leases = page.getByRole("region", { name: "Leases held" });
  await expect(leases.getByTestId("lease")).toHaveCount(1);
  await expect(leases.getByTestId("lease")).toContainText("running");
  await expect(page.getByTestId(`used-${policy}-running`)).toHaveText("1 / 2");
  await page.screenshot({ path: test.info().outputPath("leases.png"), fullPage: true });
  await leases.getByLabel("Reason").fill("worker crashed, ticket 42");
  await leases.getByRole("button", { name: "Release" }).click();
  // Hydrated, the page says so in place; without JavaScript the form posts and the page
  // comes back read afresh, saying so too. Either way the lease is gone and the rule holds
  // nothing.
  await expect(page.getByRole("status").filter({ hasText: "Lease released." })).toBeVisible();
  await expect(page.getByRole("region", { name: "Leases held" })).toHaveCount(0);
  await expect(page.getByTestId("untouched")).toContainText(policy);

  // Released for real: the holder's own release finds nothing, and the audit log says who.
  const again = await request.post("/api/v1/leases/release", {
    headers: { Authorization: `Bearer ${E2E_SERVICE_KEY}` },
    data: { lease },
  });
  expect((await again.json()).results[0].released).toBe(false);
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Audit" }).click();
  await expect(page.getByText("worker crashed, ticket 42").first()).toBeVisible();
});
