// Start-up: from the settings to a loaded Worker over Miniflare's bindings.
//
// Reading workerd's flags, building the upload, importing wrangler and
// starting Miniflare run alongside each other and Pyodide's start. Pyodide is
// restored from a memory snapshot taken after an earlier start's import of
// the same upload (snapshot.mjs: ~0.3 s, once the upload and the flags give
// its key), or loaded cold (~2 s; at once when no snapshot is kept). The
// Pyodide is the npm `pyodide` package.json pins; it must be the one workerd
// selects for this Worker (flags.mjs), or the host refuses to start. Then the
// config's D1 migrations are applied, as `wrangler d1 migrations apply
// --local` would, and the Worker is loaded (worker.mjs): imported, then
// snapshotted, on a cold start; found in memory on a warm one.
//
// wrangler and relay.mjs (Miniflare) are imported inside boot(), once
// Pyodide's start is under way, so their import time overlaps it.

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadPyodide } from 'pyodide';
import { parseCrons } from './cron.mjs';
import { cachedCompatFlags, selectPython } from './flags.mjs';
import { ConsumerLanes } from './lanes.mjs';
import { oneError, warn } from './lifecycle.mjs';
import { EnvView, SnapshotCache, restorePyodide, snapshotKey, takeSnapshot } from './snapshot.mjs';
import { loadWorker, workerModules } from './worker.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.dirname(HERE);

/** What wrangler's own config reader sees (the same `main`, vars, D1 ids and
 * crons), with the Worker's main module as Python names it. */
function readConfig(readWranglerConfig, configPath, root) {
  let config;
  try {
    config = readWranglerConfig({ config: configPath });
  } catch (e) {
    throw new Error(`cannot read ${configPath}: ${e.message}`);
  }
  if (!config.main || !config.main.endsWith('.py')) throw new Error(`wrangler.toml 'main' must be a .py file (got ${config.main})`);
  if (!config.compatibility_date) throw new Error(`${configPath} has no compatibility_date`);
  const mainPath = path.resolve(root, config.main);
  const moduleRoot = config.base_dir ? path.resolve(root, config.base_dir) : path.dirname(mainPath);
  const mainFile = path.relative(moduleRoot, mainPath);
  return { config, mainFile, mainModule: mainFile.slice(0, -3).split(path.sep).join('.') };
}

/** The Python release workerd selects for the config's date and flags
 * (flags.mjs): checked as soon as the flags are known, and again against the
 * Pyodide actually loaded. */
class PythonRelease {
  constructor(config) {
    this.config = config;
    this.release = null;
  }

  select(flags) {
    this.release = selectPython(flags);
  }

  check(version) {
    const { config, release } = this;
    if (!release) {
      throw new Error(`compatibility_flags ${JSON.stringify(config.compatibility_flags ?? [])} at ${config.compatibility_date} turn no Python release on: a Python Worker needs "python_workers"`);
    }
    if (version !== release.pyodide) {
      throw new Error(`workerd runs this Worker on Pyodide ${release.pyodide} (${release.flag} is the newest Python release flag on at ${config.compatibility_date}), but node_modules has pyodide ${version}: set "pyodide": "${release.pyodide}" in package.json and run npm install`);
    }
  }
}

/** The upload, as `make deploy` would upload it: built into --root's
 * .wrangler/bundle by tools/bundle.py (which reuses an up-to-date one), run
 * by D1QUEUE_HOST_PYTHON when set (`d1queue dev`'s own Python: the upload
 * vendors the d1queue installed there), else the repository's venv. */
function buildBundle(root) {
  const outdir = path.join(root, '.wrangler', 'bundle');
  const venvPython = path.join(REPO, '.venv', 'bin', 'python');
  const python = process.env.D1QUEUE_HOST_PYTHON || (fs.existsSync(venvPython) ? venvPython : 'python3');
  const args = [path.join(REPO, 'tools', 'bundle.py'), '--root', root, '--reuse', '--outdir', outdir];
  return new Promise((resolve, reject) => {
    execFile(python, args, { maxBuffer: 1 << 24 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`building the upload failed (${python} ${args.join(' ')}):\n${(stdout + stderr).trim()}`));
      else resolve(outdir);
    });
  });
}

// As `wrangler d1 migrations apply --local` does (wrangler/src/d1/migrations):
// the same table, the file text plus its INSERT INTO the migrations table,
// split by wrangler's own splitter and sent as one batch (one transaction).
const quoteIdent = (id) => `"${id.replace(/"/g, '""')}"`;
async function migrate(config, root, d1Bindings, splitSqlQuery) {
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
      throw new Error(`cannot read the migrations table of ${d1.binding}: ${e.message}`);
    }
    for (const file of files.filter((f) => !applied.has(f))) {
      const sql = `${fs.readFileSync(path.join(dir, file), 'utf8')}\nINSERT INTO ${table} (name)\nvalues ('${file.replace(/'/g, "''")}');`;
      try {
        await db.batch(splitSqlQuery(sql).map((q) => db.prepare(q)));
      } catch (e) {
        throw new Error(`migration ${file} failed on ${d1.binding}: ${String(e?.cause?.message ?? e.message).split('\n')[0]}`);
      }
    }
  }
}

/**
 * Pyodide for the Worker, as {pyodide, snapshot}: restored from the snapshot
 * under `key` when the cache has a whole one Pyodide accepts (`snapshot`:
 * what was read), else loaded cold (`snapshot` null). `envReady` resolves once
 * the env has its bindings, which a snapshot referring to them waits for.
 */
async function startPyodide({ snapshots, key, modules, options, envReady }) {
  let found = null;
  try {
    found = snapshots.read(key);
  } catch (e) {
    warn(`snapshot ${snapshots.file(key)} is unusable (${e.message}): deleted, booting cold`);
    snapshots.discard(key);
  }
  if (found) {
    try {
      if (found.meta.envDeep) await envReady;
      return { pyodide: await restorePyodide(loadPyodide, found.bytes, modules, options), snapshot: found };
    } catch (e) {
      warn(`snapshot ${snapshots.file(key)} could not be restored (${oneError(e).split('\n')[0]}): deleted, booting cold`);
      snapshots.discard(key);
    }
  }
  return { pyodide: await loadPyodide(options), snapshot: null };
}

/**
 * Boot the host's Worker. `host`: {settings (cli.mjs), limits, faults,
 * queueFaults, pending, life (lifecycle.mjs)}; every failure ends the process
 * through life.fail, with Miniflare disposed of. Resolves to
 * {config, crons, lanes, release, pyodide, bundleDir, queueBindings, worker,
 * prefix, start}, `start` saying how Python started: {warm, note} (snapshot.mjs).
 */
export async function boot(host) {
  const { settings, limits, life } = host;
  const pyodideOptions = {
    // Worker output, line by line as it happens.
    stdout: (line) => limits.stdout(line), // the drain's lines wait for their invocation's CPU figure
    stderr: (line) => process.stderr.write(line + '\n'),
  };
  // Memory snapshots (snapshot.mjs): the key needs the upload and the flags,
  // so a restore starts once both are known. With none to restore (the
  // first start, or --no-snapshot), the cold load starts at once instead.
  const snapshots = settings.snapshot ? new SnapshotCache(path.join(settings.root, '.wrangler', 'snapshots')) : null;
  const coldReady = !snapshots || snapshots.empty() ? loadPyodide(pyodideOptions) : null;
  coldReady?.catch(() => {}); // awaited below; not "unhandled" meanwhile
  const wrangler = await import('wrangler');
  const { startBindings, workerEnv } = await import('./bindings.mjs');

  let read;
  try {
    read = readConfig(wrangler.unstable_readConfig, settings.configPath, settings.root);
  } catch (e) {
    return life.fail(e.message);
  }
  const { config } = read;
  const crons = parseCrons(config.triggers?.crons ?? []);

  // The flags workerd turns on for this date and these flags (flags.mjs; read
  // once per workerd version, date and flags, then remembered in .wrangler/).
  const python = new PythonRelease(config);
  const pyodideVersion = JSON.parse(fs.readFileSync(new URL('package.json', import.meta.resolve('pyodide')), 'utf8')).version;
  const flagsReady = cachedCompatFlags({
    compatibilityDate: config.compatibility_date,
    compatibilityFlags: config.compatibility_flags ?? [],
  }, path.join(REPO, '.wrangler', 'compat-flags.json')).then((flags) => {
    python.select(flags);
    python.check(pyodideVersion);
    return flags;
  });
  flagsReady.catch(() => {});
  const bundleReady = settings.bundle ? Promise.resolve(settings.bundle) : buildBundle(settings.root);
  bundleReady.catch(() => {});

  // The Worker's env: this object, which Python's modules refer to, gets the
  // bindings once Miniflare runs. The JS modules Python imports are made as
  // soon as the flags are known, before a restored Pyodide needs them.
  const env = {};
  let envFilled;
  const envReady = new Promise((resolve) => { envFilled = resolve; });
  const envView = new EnvView(env);
  let current = null; // the Pyodide the modules serve
  let modules, key;
  const pythonReady = Promise.all([flagsReady, bundleReady]).then(async ([compatFlags, bundleDir]) => {
    modules = workerModules({ pyodideOf: () => current, compatFlags, env: envView.proxy, limits, pending: host.pending });
    if (!snapshots) return { pyodide: await coldReady, snapshot: null };
    key = snapshotKey({ bundleDir, sites: settings.sites, mainModule: read.mainModule, compatFlags, pyodideVersion });
    if (coldReady) return { pyodide: await coldReady, snapshot: null };
    return startPyodide({ snapshots, key, modules, options: pyodideOptions, envReady });
  });
  pythonReady.catch(() => {});

  const lanes = new ConsumerLanes(settings.consumerLanes, config);
  // Batches Miniflare delivers before the Worker is loaded wait for it.
  let workerLoaded;
  const workerReady = new Promise((resolve) => { workerLoaded = resolve; });
  const [started, compatFlags, bundleDir, bindings] = await Promise.all([
    pythonReady,
    flagsReady,
    bundleReady,
    (async () => {
      // wrangler's own view of the bindings: D1 ids, [vars] and .dev.vars.
      const workerOptions = lanes.apply(wrangler.unstable_getMiniflareWorkerOptions(settings.configPath).workerOptions);
      const made = await startBindings(host, config, workerOptions, lanes, async (raw) => (await workerReady).queue(raw, lanes.queueOf(raw.queue)));
      Object.assign(env, workerEnv(workerOptions, made, settings.vars, limits));
      envFilled();
      return made;
    })(),
  ]).catch(async (e) => life.fail(`start-up failed: ${e.message}`));

  let { pyodide, snapshot } = started;
  let worker, why; // why: a snapshot there is not used
  // Where d1queue is mounted in a Worker of one's own (its D1QUEUE_PREFIX;
  // the Worker itself checks the var), for the links the host prints.
  const prefix = String(env.D1QUEUE_PREFIX ?? '').trim().replace(/\/+$/, '');
  const load = (restored) => {
    current = pyodide;
    python.check(pyodide.version);
    return loadWorker({
      pyodide, restored, modules, compatFlags, bundleDir, env, limits, pending: host.pending,
      mainFile: read.mainFile, mainModule: read.mainModule, mainName: config.main, sites: settings.sites,
    });
  };
  try {
    await migrate(config, settings.root, bindings.d1, wrangler.unstable_splitSqlQuery);
    if (snapshot) {
      // A value the Worker read from its env at import is in the snapshot:
      // used only if the env still has it.
      const changed = Object.entries(envView.fingerprint(snapshot.meta.envRead))
        .filter(([name, print]) => snapshot.meta.env[name] !== print).map(([name]) => name);
      if (changed.length) {
        why = `the Worker read env ${changed.join(', ')} at import, changed since snapshot ${key.slice(0, 12)}`;
        snapshot = null;
        pyodide = await loadPyodide(pyodideOptions);
      }
    }
    if (snapshot) {
      try {
        worker = load(true);
      } catch (e) {
        warn(`snapshot ${snapshots.file(key)} did not give the Worker back (${e.message.split('\n').slice(0, 2).join(' ')}): deleted, booting cold`);
        snapshots.discard(key);
        snapshot = null;
        pyodide = await loadPyodide(pyodideOptions);
      }
    }
    if (!snapshot) {
      worker = envView.recording(() => load(false));
      const kept = snapshots ? takeAndKeep(snapshots, key, pyodide, modules, envView, host.pending) : '--no-snapshot';
      why = why ? `${why}; ${kept}` : kept;
    }
  } catch (e) {
    return life.fail(e.message);
  }
  workerLoaded(worker);
  return {
    config, crons, lanes, release: python.release, pyodide, bundleDir, queueBindings: bindings.queues, worker, prefix,
    start: { warm: Boolean(snapshot), note: snapshot ? `warm (snapshot ${key.slice(0, 12)})` : `cold (${why})` },
  };
}

/** Take the snapshot of the Worker just imported and write it in the
 * background (host.pending waits for it); says what was done, for the ready
 * line. A snapshot that cannot be taken or written leaves the host cold. */
function takeAndKeep(snapshots, key, pyodide, modules, envView, pending) {
  let taken;
  try {
    taken = takeSnapshot(pyodide, modules);
  } catch (e) {
    warn(`no snapshot of this Worker: ${e.message}`);
    return 'no snapshot: see above';
  }
  const meta = { envDeep: taken.envDeep, envRead: envView.names, env: envView.fingerprint(envView.names) };
  pending.add(snapshots.write(key, meta, taken.bytes).catch((e) => warn(`writing snapshot ${snapshots.file(key)} failed: ${e.message}`)));
  return `snapshot ${key.slice(0, 12)} taken`;
}
