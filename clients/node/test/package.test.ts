/** What the npm package ships: the very lua/rotator.lua, and its type declarations. */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { MODULE_PATH, moduleSha } from "../dist/index";
import { ROOT } from "./servers";

const PACKAGE = join(ROOT, "clients", "node");

test("the package's lua/rotator.lua is byte-identical to ../../lua/rotator.lua", () => {
  const shipped = readFileSync(join(PACKAGE, "lua", "rotator.lua"));
  const original = readFileSync(join(ROOT, "lua", "rotator.lua"));
  assert.ok(shipped.equals(original), "run `npm run build` to copy the module again");
  assert.equal(readFileSync(MODULE_PATH).compare(original), 0);
  assert.equal(moduleSha(), createHash("sha1").update(original).digest("hex"));
});

test("package.json ships dist (with declarations) and the module", () => {
  const manifest = JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8")) as Record<string, unknown>;
  assert.equal(manifest["name"], "rotator-queue");
  assert.equal(manifest["types"], "dist/index.d.ts");
  assert.deepEqual(manifest["files"], ["dist", "lua/rotator.lua"]);
  for (const file of ["index.js", "index.d.ts", "rotator.d.ts", "errors.d.ts"]) {
    assert.ok(existsSync(join(PACKAGE, "dist", file)), `dist/${file} missing`);
  }
});
