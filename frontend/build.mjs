// Bundles the dashboard's TypeScript and CSS (frontend/static/src) into frontend/static/dist with esbuild.
// One module per page; third-party code (uPlot) comes from node_modules, never the repo.
import * as esbuild from "esbuild";
import { gzipSync } from "node:zlib";
import { readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, "static", "src");
const dist = join(here, "static", "dist");
const watch = process.argv.includes("--watch");

const options = {
  entryPoints: {
    board: join(src, "board.ts"),
    run: join(src, "run.ts"),
    samples: join(src, "samples.ts"),
    submit: join(src, "submit.ts"),
    settings: join(src, "settings.ts"),
    compare: join(src, "compare.ts"),
    common: join(src, "common.ts"),
    app: join(src, "app.css"),
  },
  outdir: dist,
  bundle: true,
  // One self-contained module per page: no chunk requests after the HTML (the shared helpers are a few KB).
  splitting: false,
  format: "esm",
  minify: true,
  sourcemap: false,
  target: ["es2020"],
  logLevel: "warning",
};

// Applied before first paint (a classic script in <head>): the saved theme, without an inline <script>,
// which the Content-Security-Policy (script-src 'self') forbids.
const headOptions = { ...options, entryPoints: { "theme-init": join(src, "theme_init.ts") }, format: "iife" };

if (watch) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
  await (await esbuild.context(headOptions)).watch();
  console.log("watching frontend/static/src ...");
} else {
  rmSync(dist, { recursive: true, force: true });
  await esbuild.build(options);
  await esbuild.build(headOptions);
  let raw = 0, gz = 0;
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      const p = join(dir, name);
      if (statSync(p).isDirectory()) walk(p);
      else if (/\.(js|css)$/.test(name)) { const b = readFileSync(p); raw += b.length; gz += gzipSync(b, { level: 9 }).length; }
    }
  };
  walk(dist);
  console.log(`frontend assets: ${(raw / 1024).toFixed(1)} KB, ${(gz / 1024).toFixed(1)} KB gzip -> ${dist}`);
}
