import { expect, test } from "./fixtures/test";
import { signIn, waitForHydration } from "./fixtures/people";
import { check, putPolicy, shot } from "./fixtures/api";

// Answers that hold over time: "blocked" as a state with its share and since, and bob
// blocked through an address many users share, told with its count and lifted where the
// page points. Each runs hydrated and with JavaScript off.

test("who is blocked right now and since when: a client denied most of its checks", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `steady-${testInfo.project.name}`;
  const ip = hydrated ? "192.0.2.80" : "192.0.2.81";
  await signIn(page);
  await putPolicy(page, policy, {
    rules: [{ name: "per-hour", algorithm: "fixed_window", limit: 3, window_ms: 3_600_000, dimensions: ["ip"] }],
  });
  for (let i = 0; i < 40; i++) await check(page, policy, { user: `scraper-${testInfo.project.name}`, ip });
  await page.goto(`/?filter=${policy}`);
  if (hydrated) await waitForHydration(page);
  const row = page.getByTestId("throttled").getByRole("row", { name: new RegExp(`ip=${ip}`) });
  await expect(async () => {
    if (!hydrated) await page.reload();
    // 37 checks since its first denial, every one denied: blocked as a state.
    await expect(row.getByTestId("state")).toContainText("blocked: denied 100 % of 37 checks", { timeout: 1000 });
  }).toPass({ timeout: 15_000 });
  await expect(row).toContainText("ago");
  await shot(page, "blocked-as-a-state");
  // The inspector says the same over time beside the instant verdict.
  await page.goto(`/identifiers?id=ip%3D${ip}`);
  await expect(page.getByTestId("verdict")).toContainText("Blocked now");
  await expect(page.getByTestId("steady")).toContainText(`Over time: blocked in ${policy} — denied 100 % of 37 checks`);
});

test("bob is blocked through an address many share: the page counts them and points at it", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const policy = `shared-${testInfo.project.name}`;
  const bob = `bob-shared-${testInfo.project.name}`;
  const ip = hydrated ? "198.51.100.70" : "198.51.100.71";
  await signIn(page);
  await putPolicy(page, policy, {
    rules: [
      { name: "per-ip", algorithm: "fixed_window", limit: 20, window_ms: 3_600_000, dimensions: ["ip"] },
      { name: "per-user", algorithm: "fixed_window", limit: 100, window_ms: 3_600_000, dimensions: ["user"] },
    ],
  });
  for (let i = 0; i < 20; i++) await check(page, policy, { user: `u${i}-${testInfo.project.name}`, ip });
  expect(await check(page, policy, { user: bob, ip })).toBe(429);
  await expect(async () => {
    await page.goto(`/identifiers?id=user%3D${bob}`);
    await expect(page.getByTestId("through-another")).toContainText("a shared address?", { timeout: 1000 });
  }).toPass({ timeout: 15_000 });
  const hint = page.getByTestId("through-another");
  await expect(hint).toContainText(`ip=${ip} was checked with 2`);
  await expect(page.getByTestId("companions")).toContainText("checked with");
  await shot(page, "shared-address");
  // The page's link goes to the address; one reset there (decided when pressed) lifts bob.
  await hint.getByRole("link", { name: `reset, exempt or limit ip=${ip}` }).click();
  await expect(page.getByTestId("verdict")).toContainText(`Blocked now by ${policy} › per-ip on ip=${ip}`);
  if (hydrated) await waitForHydration(page);
  await expect(page.getByLabel("What")).toHaveValue("now");
  await page.getByRole("region", { name: "Reset" }).getByLabel("Reason").fill("shared office address, ticket 9");
  await page.getByRole("button", { name: "Reset counters" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Reset done" })).toContainText(`${policy} › per-ip on ip=${ip}`);
  expect(await check(page, policy, { user: bob, ip })).toBe(200);
});
