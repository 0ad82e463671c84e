import { expect, test } from "./fixtures/test";
import { signIn, waitForHydration } from "./fixtures/people";

test("an admin adds an alert rule in the dashboard, sees a bad field named, and removes it", async ({ page }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const name = `floods-${testInfo.project.name}`;
  await signIn(page);
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Alerts" }).click();
  await expect(page.getByRole("heading", { level: 1, name: "Alerts" })).toBeVisible();
  if (hydrated) await waitForHydration(page);

  const form = page.getByRole("region", { name: "Add or replace a rule" });
  await form.getByLabel("Name").fill(name);
  await form.getByLabel("Watch").selectOption("policy_denials");
  await form.getByLabel("Policy", { exact: true }).fill("demo");
  await form.getByLabel("Denials a second above").fill("20");
  await form.getByLabel("Averaged over (s)").fill("120");
  await form.getByLabel("Webhook URL").fill("https://hooks.example.com/spillway");
  await form.getByLabel("Secret (16 to 256 characters, signs each delivery)").fill("too short");
  await form.getByRole("button", { name: "Save rule" }).click();
  // The bad field is named beside it.
  await expect(page.getByRole("region", { name: "Add or replace a rule" }).locator("label", { hasText: "Secret" }).getByRole("alert")).toHaveText(
    "must be 16 to 256 characters",
  );

  // Nothing typed is lost, with or without JavaScript, but the secret and the webhook URL
  // are asked for again without it (neither ever travels in an address).
  const again = page.getByRole("region", { name: "Add or replace a rule" });
  await expect(again.getByLabel("Name")).toHaveValue(name);
  await expect(again.getByLabel("Watch")).toHaveValue("policy_denials");
  await expect(again.getByLabel("Policy", { exact: true })).toHaveValue("demo");
  await expect(again.getByLabel("Denials a second above")).toHaveValue("20");
  await expect(again.getByLabel("Averaged over (s)")).toHaveValue("120");
  if (!hydrated) await expect(again).toContainText("type them again");
  // Without JavaScript the webhook URL (often itself a secret) is asked for again.
  if (!hydrated) await again.getByLabel("Webhook URL").fill("https://hooks.example.com/spillway");
  else await expect(again.getByLabel("Webhook URL")).toHaveValue("https://hooks.example.com/spillway");
  await again.getByLabel("Secret (16 to 256 characters, signs each delivery)").fill("a secret that is long enough");
  await again.getByRole("button", { name: "Save rule" }).click();
  const rules = page.getByTestId("alert-rules");
  await expect(rules).toContainText(name);
  await expect(rules).toContainText("demo: more than 20 denials a second over 120 s");
  await expect(page.getByTestId("firing")).toBeVisible();
  // A save that succeeds clears the form.
  await expect(page.getByRole("region", { name: "Add or replace a rule" }).getByLabel("Name")).toHaveValue("");
  await page.screenshot({ path: test.info().outputPath("alerts.png"), fullPage: true });

  await rules.getByRole("row", { name: new RegExp(name) }).getByText("Remove…").click();
  await rules.getByRole("button", { name: `Remove ${name}` }).click();
  await expect(page.getByTestId("alert-rules")).not.toContainText(name);
});
