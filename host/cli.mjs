// The host's command line, turned into one frozen settings object.
//
//   node host/host.mjs [--config FILE (default: --root's wrangler.toml)] [--port 8787] [--persist-to DIR | --fresh] [--crons]
//                      [--test-hooks] [--raw-db] [--root DIR] [--bundle DIR]
//                      [--var NAME=VALUE ...] [--site DIR ...]   (over [vars] and .dev.vars; tests set secrets so)
//                      [--plan free|paid] [--cpu enforce|warn] [--cpu-ms N] [--no-limits]
//                      [--wait-until-s 30] [--scheduled-s 900]
//                      [--d1-fault RATE] [--d1-fault-kinds K,...] [--d1-latency-ms N] [--d1-seed N]
//                      [--d1-rtt-ms N] [--d1-busy-ms N] [--consumer-lanes N|max] [--no-snapshot]
//
// --port 0 takes a free port (the ready line names it). D1 state: --persist-to
// DIR keeps it in DIR/v3/d1, --fresh in a temporary folder removed at exit,
// neither in .wrangler/state next to wrangler.toml (lifecycle.mjs).
//
// --bundle DIR serves an upload already built; without it the host builds one
// into --root's .wrangler/bundle first (tools/bundle.py --outdir; boot.mjs).
//
// The Worker's Pyodide is restored from a memory snapshot taken after its
// import by an earlier start with the same upload, kept in --root's
// .wrangler/snapshots (snapshot.mjs); --no-snapshot boots it cold and keeps none.
//
// --test-hooks adds the /__test/ routes (hooks.mjs); --crons runs the config's
// crons every minute (cron.mjs); --raw-db hands the Worker D1 bindings the
// SDK does not wrap, so Python sees the bare JsProxy (d1.mjs); --site DIR
// copies more pure-Python packages into site-packages.
//
// Limits mode (limits.mjs, on unless --no-limits; --plan paid by default): each
// invocation (a fetch, a scheduled run, an RPC or test-hook call, with its
// waitUntil work) gets the plan's subrequest, D1-query and CPU caps, waitUntil
// work is cut --wait-until-s after the response and a scheduled run after
// --scheduled-s; each prints a {"event":"d1queue.invocation",...} line.
// --plan, --cpu and the numbers are checked by Limits itself.
//
// D1 faults (faults.mjs): on a fraction RATE of the Worker's D1 calls,
// "Network connection lost." before the call or after it committed, or "D1 DB
// is overloaded"; every call may first wait up to --d1-latency-ms. Seeded;
// the ready line says how (GET /__test/faults, with --test-hooks: the totals).
// The numbers are checked by D1Faults itself.
//
// --consumer-lanes N (1..250, Queues' max_concurrency) or `max` (the config's
// consumer max_concurrency): consumer invocations that may run at once
// (lanes.mjs).
//
// Only node: built-ins, so host.mjs can load it before checking Node's version.

import path from 'node:path';
import { parseArgs } from 'node:util';

const OPTIONS = {
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
  'no-snapshot': { type: 'boolean', default: false },
};

/** The most consumer lanes: Queues' highest max_concurrency. */
export const MAX_LANES = 250;

/** The settings `args` ask for, frozen; throws an Error whose message says
 * what is wrong with them. */
export function parseSettings(args = process.argv.slice(2)) {
  const { values: opts } = parseArgs({ args, options: OPTIONS });
  const port = Number(opts.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`bad --port '${opts.port}'`);
  if (opts.fresh && opts['persist-to']) throw new Error('--fresh and --persist-to are exclusive');
  const lanes = opts['consumer-lanes'] === 'max' ? 'max' : Number(opts['consumer-lanes']);
  if (lanes !== 'max' && !(Number.isInteger(lanes) && lanes >= 1 && lanes <= MAX_LANES)) {
    throw new Error(`--consumer-lanes wants 1..${MAX_LANES} (Queues' max_concurrency) or 'max', not '${opts['consumer-lanes']}'`);
  }
  const vars = opts.var.map((pair) => {
    const eq = pair.indexOf('=');
    if (eq < 1) throw new Error(`--var wants NAME=VALUE, got '${pair}'`);
    return Object.freeze([pair.slice(0, eq), pair.slice(eq + 1)]);
  });
  const root = path.resolve(opts.root);
  return Object.freeze({
    port,
    root,
    configPath: opts.config ? path.resolve(opts.config) : path.join(root, 'wrangler.toml'),
    bundle: opts.bundle ? path.resolve(opts.bundle) : null, // null: build the upload
    persistTo: opts['persist-to'] ? path.resolve(opts['persist-to']) : null,
    fresh: opts.fresh,
    crons: opts.crons,
    testHooks: opts['test-hooks'],
    rawDb: opts['raw-db'],
    vars: Object.freeze(vars), // [name, value] pairs, later ones winning
    sites: Object.freeze(opts.site.map((dir) => path.resolve(dir))),
    consumerLanes: lanes, // a number, or 'max': the config's max_concurrency
    snapshot: !opts['no-snapshot'], // restore / take memory snapshots (snapshot.mjs)
    limits: Object.freeze({ // Limits' options (limits.mjs)
      enabled: !opts['no-limits'],
      plan: opts.plan,
      cpu: opts.cpu,
      cpuMs: opts['cpu-ms'] === undefined ? undefined : Number(opts['cpu-ms']),
      waitUntilS: Number(opts['wait-until-s']),
      scheduledS: Number(opts['scheduled-s']),
    }),
    faults: Object.freeze({ // D1Faults' options (faults.mjs)
      rate: Number(opts['d1-fault']),
      latencyMs: Number(opts['d1-latency-ms']),
      rttMs: Number(opts['d1-rtt-ms']),
      busyMs: Number(opts['d1-busy-ms']),
      ...(opts['d1-fault-kinds'] === undefined ? {} : { kinds: Object.freeze(opts['d1-fault-kinds'].split(',').map((k) => k.trim()).filter(Boolean)) }),
      ...(opts['d1-seed'] === undefined ? {} : { seed: Number(opts['d1-seed']) }),
    }),
  });
}
