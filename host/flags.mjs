// Compatibility flags and the Python they select, read from workerd itself.
//
// workerd turns flags on from the compatibility date, the flags asked for and
// the flags those imply; it refuses a flag it does not know ("No such
// compatibility flag"), which `wrangler deploy --dry-run` does not. So instead of
// guessing, readCompatFlags() starts Miniflare (the workerd wrangler ships) with
// a stub JS Worker at the Worker's date and flags and reads
// `Cloudflare.compatibilityFlags`: every flag workerd knows, true if on.
//
// With `python_workers` on, workerd fetches Cloudflare's Pyodide bundle from the
// internet at start-up (server.c++ preloadPython), even for a JS stub. The stub
// asks for `python_workers_development` as well: it implies python_workers
// (and so everything python_workers implies) but names the local development
// bundle, which workerd never fetches. It is reported as off, as the Worker has it.
//
// A Python Worker runs the newest Python release whose flag is on
// (getPythonSnapshotRelease, workerd pyodide.c++). PYTHON_RELEASES is that table
// as embedded in the workerd binary (src/pyodide/pyodide_extra.capnp releases);
// tests/runtime/test_flags.py checks it against the binary, so a workerd upgrade
// that changes it fails loudly.
//
//   node host/flags.mjs --date 2026-11-01 --flag python_workers [--flag ...]   # prints JSON
//                       [--also FLAG,FLAG ...]   # other flag lists at the same date, one run
//   node host/flags.mjs --releases                                             # the table

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

/** Oldest first: [compatibility flag, workerd's field name, Pyodide version]. */
export const PYTHON_RELEASES = [
  { flag: 'python_workers', field: 'pythonWorkers', pyodide: '0.26.0a2' },
  { flag: 'python_workers_20250116', field: 'pythonWorkers20250116', pyodide: '0.28.2' },
  { flag: 'python_workers_20260610', field: 'pythonWorkers20260610', pyodide: '314.0.4' },
  { flag: 'python_workers_314', field: 'pythonWorkers314', pyodide: '314.0.6' },
];
/** The development release: used by the stub only, never selected. */
export const DEV_FLAG = 'python_workers_development';

const STUB = 'export default { fetch() { return Response.json(Cloudflare.compatibilityFlags); } };';

/** {flag: on} as workerd sets them for a Worker at `compatibilityDate` asking
 * for `compatibilityFlags`. Throws a clear Error for an unknown flag or date. */
export async function readCompatFlags(input) {
  return (await readCompatFlagsMany([input]))[0];
}

/** readCompatFlags for several inputs at once: one workerd, a stub Worker each. */
export async function readCompatFlagsMany(inputs) {
  const { Miniflare, Log, LogLevel, convertV4MiniflareOptions } = await import('miniflare');
  const asked = inputs.map(({ compatibilityFlags = [] }) =>
    compatibilityFlags.includes('python_workers') && !compatibilityFlags.includes(DEV_FLAG)
      ? [...compatibilityFlags, DEV_FLAG]
      : compatibilityFlags);
  const mf = new Miniflare(convertV4MiniflareOptions({
    log: new Log(LogLevel.NONE),
    handleStructuredLogs() {}, // workerd's errors reach the thrown Error
    workers: inputs.map(({ compatibilityDate }, i) => ({
      name: `flags${i}`,
      modules: true,
      script: STUB,
      compatibilityDate,
      compatibilityFlags: asked[i],
    })),
  }));
  try {
    return await Promise.all(inputs.map(async ({ compatibilityFlags = [] }, i) => {
      const worker = await mf.getWorker(`flags${i}`);
      const flags = await (await worker.fetch('http://flags/')).json();
      if (asked[i] !== compatibilityFlags) flags[DEV_FLAG] = false;
      return flags;
    }));
  } catch (e) {
    const text = String(e?.message ?? e);
    const which = inputs.length === 1 ? ` (compatibility_date ${inputs[0].compatibilityDate}, compatibility_flags ${JSON.stringify(inputs[0].compatibilityFlags ?? [])})` : '';
    const unknown = text.match(/No such compatibility flag: ([\w-]+)/);
    if (unknown) throw new Error(`workerd has no compatibility flag '${unknown[1]}'${which}: Cloudflare would refuse this Worker`);
    const runtime = text.match(/"message":"([^"]+)"/);
    throw new Error(`workerd refused the Worker's compatibility settings${which}: ${runtime ? runtime[1] : text}`);
  } finally {
    await mf.dispose().catch(() => {});
  }
}

/** readCompatFlags, remembered in `cacheFile` per workerd version, date and
 * flags: the answer is workerd's own and cannot change without one of them,
 * and a second workerd at every host start-up costs ~1.5 s of CPU. */
export async function cachedCompatFlags(input, cacheFile) {
  const { version } = await import('workerd');
  const key = JSON.stringify([version, input.compatibilityDate, input.compatibilityFlags ?? []]);
  let cache = {};
  try { cache = JSON.parse(fs.readFileSync(cacheFile, 'utf8')); } catch {}
  if (cache[key]) return cache[key];
  const flags = await readCompatFlags(input);
  try {
    fs.mkdirSync(path.dirname(cacheFile), { recursive: true });
    const tmp = `${cacheFile}.${process.pid}`;
    fs.writeFileSync(tmp, JSON.stringify({ ...cache, [key]: flags }));
    fs.renameSync(tmp, cacheFile); // whole or not at all, whoever reads it meanwhile
  } catch {} // a cache it could not write is only slower
  return flags;
}

/** The Python release workerd runs with `flags` on: the newest release whose
 * flag is on; null if none is (not a Python Worker). */
export function selectPython(flags) {
  for (let i = PYTHON_RELEASES.length - 1; i >= 0; i--) {
    if (flags[PYTHON_RELEASES[i].flag]) return PYTHON_RELEASES[i];
  }
  return null;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { values } = parseArgs({
    options: {
      date: { type: 'string' },
      flag: { type: 'string', multiple: true, default: [] },
      also: { type: 'string', multiple: true, default: [] },
      releases: { type: 'boolean', default: false },
    },
  });
  if (values.releases) {
    process.stdout.write(JSON.stringify({ releases: PYTHON_RELEASES, dev: DEV_FLAG }) + '\n');
  } else {
    if (!values.date) {
      process.stderr.write('flags.mjs: --date YYYY-MM-DD is required\n');
      process.exit(2);
    }
    try {
      // --also a,b,c: the same date with those flags instead, answered in the same run.
      const inputs = [values.flag, ...values.also.map((list) => list.split(',').filter(Boolean))]
        .map((compatibilityFlags) => ({ compatibilityDate: values.date, compatibilityFlags }));
      const answers = (await readCompatFlagsMany(inputs)).map((flags) => ({ flags, release: selectPython(flags) }));
      process.stdout.write(JSON.stringify(values.also.length ? answers : answers[0]) + '\n');
    } catch (e) {
      process.stderr.write(`flags.mjs: ${e.message}\n`);
      process.exit(1);
    }
  }
}
