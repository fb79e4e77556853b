// Copies the one Lua module into the package (lua/rotator.lua): the npm package ships the very
// file the Python client ships, byte for byte (test/package.test.ts checks it).
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const source = path.resolve(__dirname, "..", "..", "..", "lua", "rotator.lua");
const target = path.resolve(__dirname, "..", "lua", "rotator.lua");
fs.mkdirSync(path.dirname(target), { recursive: true });
fs.copyFileSync(source, target);
