// Start-up: from the settings to a loaded Worker over Miniflare's bindings.
//
// Pyodide's load (~2.4 s) starts first; reading workerd's flags, building the
// upload, importing wrangler and starting Miniflare run alongside. The Pyodide
// loaded is the npm `pyodide` package.json pins; it must be the one workerd
// selects for this Worker (flags.mjs), or the host refuses to start. Then the
// config's D1 migrations are applied, as `wrangler d1 migrations apply
// --local` would, and the Worker is loaded (worker.mjs).
//
// wrangler and relay.mjs (Miniflare) are imported inside boot(), once
// Pyodide's load is under way, so their import time overlaps it.

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadPyodide } from 'pyodide';
import { parseCrons } from './cron.mjs';
import { cachedCompatFlags, selectPython } from './flags.mjs';
import { ConsumerLanes } from './lanes.mjs';
import { loadWorker } from './worker.mjs';

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
 * Boot the host's Worker. `host`: {settings (cli.mjs), limits, faults,
 * queueFaults, pending, life (lifecycle.mjs)}; every failure ends the process
 * through life.fail, with Miniflare disposed of. Resolves to
 * {config, crons, lanes, release, pyodide, bundleDir, queueBindings, worker, prefix}.
 */
export async function boot(host) {
  const { settings, limits, life } = host;
  const pyodideReady = loadPyodide({
    // Worker output, line by line as it happens.
    stdout: (line) => limits.stdout(line), // the drain's lines wait for their invocation's CPU figure
    stderr: (line) => process.stderr.write(line + '\n'),
  });
  pyodideReady.catch(() => {}); // awaited below; not "unhandled" meanwhile
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

  const lanes = new ConsumerLanes(settings.consumerLanes, config);
  // Batches Miniflare delivers before the Worker is loaded wait for it.
  let workerLoaded;
  const workerReady = new Promise((resolve) => { workerLoaded = resolve; });
  let workerOptions;
  const [pyodide, compatFlags, bundleDir, bindings] = await Promise.all([
    pyodideReady,
    flagsReady,
    bundleReady,
    (async () => {
      // wrangler's own view of the bindings: D1 ids, [vars] and .dev.vars.
      workerOptions = lanes.apply(wrangler.unstable_getMiniflareWorkerOptions(settings.configPath).workerOptions);
      return startBindings(host, config, workerOptions, lanes, async (raw) => (await workerReady).queue(raw, lanes.queueOf(raw.queue)));
    })(),
  ]).catch(async (e) => life.fail(`start-up failed: ${e.message}`));

  let worker;
  let prefix;
  try {
    await migrate(config, settings.root, bindings.d1, wrangler.unstable_splitSqlQuery);
    const env = workerEnv(workerOptions, bindings, settings.vars, limits);
    // Where d1queue is mounted in a Worker of one's own (its D1QUEUE_PREFIX;
    // the Worker itself checks the var), for the links the host prints.
    prefix = String(env.D1QUEUE_PREFIX ?? '').trim().replace(/\/+$/, '');
    python.check(pyodide.version);
    worker = loadWorker({
      pyodide, compatFlags, bundleDir, env, limits, pending: host.pending,
      mainFile: read.mainFile, mainModule: read.mainModule, mainName: config.main, sites: settings.sites,
    });
  } catch (e) {
    return life.fail(e.message);
  }
  workerLoaded(worker);
  return { config, crons, lanes, release: python.release, pyodide, bundleDir, queueBindings: bindings.queues, worker, prefix };
}
