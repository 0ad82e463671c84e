// Generates openapi.d.ts from the running server's document with openapi-typescript, type-
// checks every-operation.ts against it with a strict tsc, and runs it.
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import openapiTS, { astToString } from "openapi-typescript";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const ast = await openapiTS(new URL("/api/openapi.json", process.env.SPILLWAY_URL));
writeFileSync(join(here, "openapi.d.ts"), astToString(ast));
execFileSync(join(root, "node_modules/.bin/tsc"), ["-p", here], { stdio: "inherit" });
await import(join(root, "dist-generated", "every-operation.js"));
