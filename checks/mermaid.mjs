#!/usr/bin/env node
// Check the syntax of every Mermaid diagram (```mermaid blocks) in Markdown files with Mermaid's
// own parser (the npm package "mermaid", pinned in package.json; what GitHub renders), offline:
// mermaid.parse needs a DOM for its sanitizer, which jsdom (pinned beside it) provides. No
// browser is downloaded or started, so it checks syntax, not the drawing.
//
//   node checks/mermaid.mjs README.md docs/*.md
//
// Prints one line per diagram that does not parse (file:line: the parser's message), then one
// summary line, and exits 1 if any diagram does not parse (2 on a usage error).
import { readFileSync } from "node:fs";
import { JSDOM } from "jsdom";

const FENCE = /^```mermaid[ \t]*\n([\s\S]*?)^```[ \t]*$/gm;

function diagrams(text) {
  const found = [];
  for (const match of text.matchAll(FENCE)) {
    const line = text.slice(0, match.index).split("\n").length + 1;
    found.push({ line, source: match[1] });
  }
  return found;
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node checks/mermaid.mjs FILE.md...");
    return 2;
  }
  const { window } = new JSDOM("<!doctype html><html><body></body></html>");
  globalThis.window = window;
  globalThis.document = window.document;
  const { default: mermaid } = await import("mermaid");
  mermaid.initialize({ startOnLoad: false });
  let count = 0;
  let failed = 0;
  for (const file of files) {
    for (const { line, source } of diagrams(readFileSync(file, "utf8"))) {
      count += 1;
      try {
        const parsed = await mermaid.parse(source);
        console.log(`${file}:${line}: ${parsed.diagramType}`);
      } catch (error) {
        failed += 1;
        const message = String(error?.message ?? error).split("\n").join(" | ");
        console.log(`${file}:${line}: does not parse: ${message}`);
      }
    }
  }
  console.log(`mermaid: ${count} diagram(s) in ${files.length} file(s), ${failed} not parsed`);
  return failed === 0 ? 0 : 1;
}

process.exitCode = await main(process.argv.slice(2));
