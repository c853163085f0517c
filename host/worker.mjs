// The Python Worker inside Pyodide, and its events.
//
// loadWorker() puts the upload where workerd puts a Python Worker's modules,
// with stand-ins for the modules only Cloudflare's runtime has
// (cloudflare:workers, the entrypoint helper, workerd's compatibility flags:
// workerModules()), and imports its `Default` class; or, in a Pyodide restored
// from a memory snapshot taken once that was done (snapshot.mjs), finds it
// there. Each event (a fetch, a scheduled run, a
// queue batch, an RPC or test-hook call) then gets a new entrypoint with its
// own ctx, as workerd constructs it, and the invocation its limits are counted
// on (limits.mjs).

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { QueueController } from './queues.mjs';
import { oneError, warn } from './lifecycle.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
/** The host's Python half, imported as `_d1queue_host`. */
export const PYHOST = path.join(HERE, 'pyhost.py');

// ------------------------------------------------------ waitUntil / ctx --

/** Every waitUntil promise still running, and every invocation still ending:
 * GET /__test/idle and shutdown wait for them. */
export class Pending {
  constructor() { this.set = new Set(); }

  /** Keep `promise` until it settles; its rejection is reported, not thrown. */
  track(promise) {
    const p = Promise.resolve(promise).catch((e) => {
      process.stderr.write(`Uncaught (in waitUntil): ${oneError(e)}\n`);
    });
    this.add(p);
    return p;
  }

  add(p) {
    this.set.add(p);
    p.finally(() => this.set.delete(p));
  }

  /** Resolves once nothing is pending, work added meanwhile included. */
  async settle() {
    while (this.set.size) await Promise.allSettled([...this.set]);
  }
}

class ExecutionContext {
  #pending;
  constructor(pending) { this.#pending = pending; this.own = new Set(); this.props = {}; }
  // workerd's patchWaitUntil (stand-in below) only patches a ctx whose
  // tag is [object ExecutionContext], as the real one is.
  get [Symbol.toStringTag]() { return 'ExecutionContext'; }
  waitUntil(promise) {
    const p = this.#pending.track(this.invocation ? this.invocation.bound(promise) : promise); // settles at a cut too (limits.mjs)
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
function waitUntilPatcher() {
  const patched = new WeakSet();
  return function patchWaitUntil(ctx) {
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
  };
}

// `from workers import env` / `patch_env` read these (cloudflare:workers).
function envPatcher(env) {
  return function* patchEnvHelper(patch) {
    const entries = patch instanceof Map ? [...patch] : Object.entries(patch); // to_js(dict) may be a Map
    const saved = entries.map(([k]) => [k, Object.getOwnPropertyDescriptor(env, k)]);
    for (const [k, v] of entries) env[k] = v;
    try { yield; } finally {
      for (const [k, d] of saved) { if (d) Object.defineProperty(env, k, d); else delete env[k]; }
    }
  };
}

// --------------------------------------------------------- Python side --

/** The names at an upload's top that are not copied: wrangler's note. */
export const UPLOAD_SKIP = new Set(['README.md']);

/** The files of `dir` copyTree copies, as [path relative to dir, absolute
 * path], sorted: what the Worker's Python sees of it. */
export function treeFiles(dir, skip = new Set(), rel = '') {
  const out = [];
  const entries = fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const entry of entries) {
    if (entry.name === '__pycache__' || entry.name.startsWith('.') || skip.has(entry.name)) continue;
    const from = path.join(dir, entry.name);
    const name = rel ? `${rel}/${entry.name}` : entry.name;
    if (entry.isDirectory()) out.push(...treeFiles(from, new Set(), name));
    else if (entry.isFile()) out.push([name, from]);
  }
  return out;
}

function copyTree(pyodide, src, dest, skip = new Set()) {
  pyodide.FS.mkdirTree(dest);
  for (const [name, from] of treeFiles(src, skip)) {
    pyodide.FS.mkdirTree(path.posix.dirname(`${dest}/${name}`));
    pyodide.FS.writeFile(`${dest}/${name}`, fs.readFileSync(from));
  }
}

/**
 * The JS modules the Worker's Python imports from the host: stand-ins for
 * the modules only Cloudflare's runtime has (cloudflare:workers, the
 * entrypoint helper, workerd's compatibility flags; the flags are workerd's
 * own) and the event loop's scheduler. `env` is the Worker's env object: its
 * bindings may be filled in later, the object stays the same. `pyodideOf()`
 * returns the Pyodide they serve (they are made before a restored one exists).
 *
 * Python keeps references to these objects, so a memory snapshot names each
 * by its place here (snapshot.mjs): keep them plain objects of functions.
 */
export function workerModules({ pyodideOf, compatFlags, env, limits, pending }) {
  // CPU is what the Worker itself runs (limits.mjs, Invocation.cpuMs): every
  // step of Pyodide's event loop goes through scheduleCallback, so each is timed
  // and charged to the invocation it belongs to.
  const loop = {
    scheduleCallback: (callback, delay) => pyodideOf()._api.scheduleCallback(() => limits.timed(() => callback()), delay),
  };
  const patchWaitUntil = waitUntilPatcher();
  const globalCtx = new ExecutionContext(pending);
  patchWaitUntil(globalCtx);
  // `from workers import wait_until`: the current invocation's ctx (limits.mjs), if any.
  const cloudflareWorkers = {
    env,
    waitUntil: (p) => {
      const ctx = limits.current()?.ctx ?? globalCtx;
      patchWaitUntil(ctx);
      return ctx.waitUntil(p);
    },
  };
  return {
    _d1queue_host_loop: loop,
    _cloudflare_compat_flags: compatFlags,
    _pyodide_entrypoint_helper: {
      cloudflareWorkersModule: cloudflareWorkers,
      cloudflareSocketsModule: {},
      doAnImport: async (name) => (name === 'cloudflare:workers' ? cloudflareWorkers : import(name)),
      workerEntrypoint: class WorkerEntrypoint {},
      patchWaitUntil,
      patch_env_helper: envPatcher(env),
    },
  };
}

/** Where workerd puts a Python Worker's modules. */
const WORKER_DIR = '/session/metadata';

/** The files the Worker's Python reads: the upload (wrangler's README.md in
 * its folder is a note about it, not part of it), --site packages and the
 * host's Python half. Pyodide's file system lives in JS, outside a memory
 * snapshot: a restored Pyodide gets them copied again. */
function writeFiles(pyodide, { compatFlags, bundleDir, mainFile, sites }) {
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
  for (const extra of sites) copyTree(pyodide, extra, sitePackages); // --site: more pure-Python packages
  pyodide.FS.writeFile(`${sitePackages}/_d1queue_host.py`, fs.readFileSync(PYHOST));
  if (!fs.existsSync(path.join(bundleDir, mainFile))) {
    throw new Error(`${bundleDir} has no ${mainFile}: --bundle takes what \`wrangler deploy --dry-run --outdir DIR\` writes`);
  }
  copyTree(pyodide, bundleDir, WORKER_DIR, UPLOAD_SKIP);
}

/**
 * Load the Worker into `pyodide`: `bundleDir` the upload, `mainModule` its
 * main module's dotted name, `sites` more pure-Python packages (--site),
 * `modules` its JS modules (workerModules()) over its `env`. With `restored`,
 * `pyodide` is a memory snapshot of a Pyodide this was done in (snapshot.mjs):
 * the Worker is imported already, only what lives outside Python's memory is
 * set up again. Throws, with the Worker's own error, when it cannot be loaded.
 */
export function loadWorker({ pyodide, restored = false, modules, compatFlags, bundleDir, mainFile, mainModule, mainName, sites, env, limits, pending }) {
  writeFiles(pyodide, { compatFlags, bundleDir, mainFile, sites });
  let pyhost, Default;
  try {
    if (restored) {
      pyhost = pyodide.pyimport('_d1queue_host');
      pyhost.resume(WORKER_DIR);
      Default = pyodide.pyimport(mainModule).Default; // imported before the snapshot: no import runs
    } else {
      for (const [name, module] of Object.entries(modules)) pyodide.registerJsModule(name, module);
      pyhost = pyodide.pyimport('_d1queue_host');
      pyhost.install_event_loop();
      pyhost.setup_search_path(WORKER_DIR, Boolean(compatFlags.python_process_pth_files));
      Default = pyhost.load_worker(mainModule).Default; // randomness refused meanwhile, as at Cloudflare's snapshot
    }
    if (typeof Default !== 'function') throw new Error(`${mainName} defines no class Default(WorkerEntrypoint)`);
  } catch (e) {
    throw new Error(`cannot load the Worker ${mainName}:\n${e.message}`);
  }
  return new Worker({ limits, pending, pyhost, Default, env });
}

// ---------------------------------------------------------------- events --

/** One event: a new entrypoint `inst` with its own `ctx`, and the invocation
 * `inv` its limits are counted on: run its calls through call() or runTest(). */
class WorkerEvent {
  constructor(worker, kind) {
    this.worker = worker;
    this.ctx = new ExecutionContext(worker.pending);
    this.inv = worker.limits.begin(kind, this.ctx);
    this.inst = worker.Default(this.ctx, worker.env);
  }

  get outcome() { return this.inv.outcome; }

  /** True while the event's waitUntil work runs. */
  get waiting() { return this.ctx.own.size > 0; }

  /** inst.<name>(...args) as workerd's wrapper calls it; `relaxed` (fetch)
   * lets the handler take fewer arguments than it is given. */
  call(relaxed, name, ...args) {
    const { limits, pyhost } = this.worker;
    return this.inv.run(() => limits.timed(() => pyhost.call_method(relaxed, this.inst, name, ...args)));
  }

  /** POST /__test/python: `source` defines `async def main(env)`. */
  runTest(source) {
    const { limits, pyhost } = this.worker;
    return this.inv.run(() => limits.timed(() => pyhost.run_test(source, this.inst)));
  }

  /** The invocation is over when its waitUntil work is, or when that work is
   * cut (limits.mjs: the window closed); then it prints its lines. Tracked
   * as pending, so /__test/idle answers after they are printed. */
  ended() {
    const { inv, ctx } = this;
    const done = (async () => {
      try {
        await inv.settle(ctx.own);
        inv.end();
      } catch (e) {
        warn(`ending an invocation: ${oneError(e)}`);
      }
    })();
    this.worker.pending.add(done);
    return done;
  }

  /** The entrypoint is done with: destroyed; resolves when the invocation ends. */
  close() {
    this.inst.destroy();
    return this.ended();
  }
}

class Worker {
  constructor({ limits, pending, pyhost, Default, env }) {
    Object.assign(this, { limits, pending, pyhost, Default, env });
  }

  /** A new event of `kind` ('fetch', 'scheduled', 'queue', 'rpc', 'test'). */
  begin(kind = 'fetch') {
    return new WorkerEvent(this, kind);
  }

  /** The Worker's `scheduled`; resolves to the invocation's outcome ('ok',
   * 'exceededCpu', ...; limits.mjs) once its waitUntil work is over. */
  async scheduled(cron, scheduledTime) {
    const event = this.begin('scheduled');
    try {
      await event.call(false, 'scheduled', new ScheduledController(cron, scheduledTime), undefined, undefined);
    } catch (e) {
      if (event.outcome !== 'exceededCpu') throw e;
      process.stderr.write(`${oneError(e)}\n`); // answered as exceededCpu by the caller
    } finally {
      await event.close(); // the event is over when its waitUntil work is
    }
    return event.outcome;
  }

  /** A batch Miniflare delivered to the relay (relay.mjs), `queue` its queue
   * as the Worker knows it: the Worker's `queue(batch)` in an invocation of its
   * own (the plan's limits, 15 min of wall time), called as workerd calls it:
   * (batch, undefined, undefined). Resolves to one decision per message
   * (queues.mjs); a handler that threw or ran out of CPU has its undecided
   * messages retried. */
  async queue(raw, queue) {
    const batch = new QueueController({ ...raw, queue });
    const event = this.begin('queue');
    let threw = false;
    try {
      await event.call(false, 'queue', batch, undefined, undefined);
    } catch (e) {
      threw = true;
      warn(`queue(${raw.queue}) threw: ${oneError(e)}`);
    } finally {
      await event.close(); // the event is over when its waitUntil work is
    }
    return batch.decisions(threw || event.outcome !== 'ok');
  }
}
