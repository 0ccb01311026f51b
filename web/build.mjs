// Builds the UI into lib/web/ui/dist, which the Go binary embeds
// (lib/web/ui.go). Run by `make build` through `npm run build`.
import * as esbuild from 'esbuild';
import { mkdirSync, rmSync, copyFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, '..', 'lib', 'web', 'ui', 'dist');
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

await esbuild.build({
  entryPoints: { app: join(here, 'src', 'main.js'), style: join(here, 'src', 'style.css') },
  bundle: true,
  minify: true,
  sourcemap: false,
  format: 'esm',
  target: ['chrome110', 'firefox110', 'safari16'],
  outdir: out,
  logLevel: 'warning',
});
copyFileSync(join(here, 'src', 'index.html'), join(out, 'index.html'));
console.log(`web UI built into ${out}`);
