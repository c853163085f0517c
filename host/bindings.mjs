// The Worker's env: the config's bindings over Miniflare (relay.mjs), each
// call counted on the invocation that makes it (limits.mjs).
//
//   D1 ([[d1_databases]]): d1.mjs, faulted by faults.mjs;
//   Queues producers ([[queues.producers]]): queues.mjs, spread over the
//     consumer lanes (lanes.mjs); a send may be failed on purpose (queues.mjs
//     QueueSendFaults);
//   Rate Limiting ([[ratelimits]]): Miniflare's, through the relay;
//   Analytics Engine ([[analytics_engine_datasets]]): analytics.mjs, its
//     points checked, counted per invocation and kept (GET /__test/analytics);
//   [vars], .dev.vars (wrangler's reading of them), then --var;
//   service bindings: each call one subrequest.

import { startMiniflare, decodeAnswer } from './relay.mjs';
import { D1Database, RawD1Database } from './d1.mjs';
import { WorkerQueue } from './queues.mjs';
import { AnalyticsDataset } from './analytics.mjs';

/**
 * Start Miniflare with wrangler's view of the config's bindings (D1 ids,
 * [vars] and .dev.vars: `workerOptions`, from unstable_getMiniflareWorkerOptions)
 * and make the Worker's bindings over it. `onQueueBatch(raw)` runs a batch
 * Miniflare delivers (relay.mjs). Miniflare is handed to `life` at once, so
 * every later failure disposes of it.
 */
export async function startBindings({ settings, limits, faults, queueFaults, life, analytics }, config, workerOptions, lanes, onQueueBatch) {
  const { mf, relay, queueCall } = await startMiniflare(workerOptions, life.stateDir, onQueueBatch);
  life.mf = mf;
  const send = async (op, payload) => {
    queueFaults.check();
    return queueCall(op, { ...payload, binding: lanes.next(payload.binding) });
  };
  const queues = new Map(); // binding name -> WorkerQueue over Miniflare's Queues
  for (const producer of config.queues?.producers ?? []) {
    queues.set(producer.binding, new WorkerQueue(producer.binding, limits.queue(send))); // counted per invocation
  }
  const rateLimits = new Map(); // binding name -> {limit({key})} over Miniflare's Rate Limiting
  for (const name of Object.keys(workerOptions.ratelimits ?? {})) {
    rateLimits.set(name, { limit: async ({ key } = {}) => queueCall('ratelimit', { binding: name, key: String(key) }) });
  }
  const d1 = new Map(); // binding name -> D1Database over Miniflare
  for (const db of config.d1_databases ?? []) {
    const Binding = settings.rawDb ? RawD1Database : D1Database;
    d1.set(db.binding, new Binding(limits.d1(relay(db.binding), faults.forDatabase(db.binding), decodeAnswer))); // counted per invocation, faulted
  }
  const datasets = new Map(); // binding name -> AnalyticsDataset
  for (const ds of config.analytics_engine_datasets ?? []) {
    datasets.set(ds.binding, new AnalyticsDataset(ds.dataset ?? ds.binding, analytics, () => limits.dataPoint()));
  }
  return { d1, queues, rateLimits, datasets };
}

/** The env the Worker's entrypoints are constructed with. */
export function workerEnv(workerOptions, { d1, queues, rateLimits, datasets }, vars, limits) {
  const env = {
    ...(workerOptions.bindings ?? {}),
    ...Object.fromEntries(d1),
    ...Object.fromEntries(queues),
    ...Object.fromEntries(rateLimits),
    ...Object.fromEntries(datasets),
  };
  for (const [name, value] of vars) env[name] = value;
  // Service bindings (objects with a fetch method), if any: each call is a subrequest.
  for (const [k, v] of Object.entries(env)) {
    if (v && typeof v === 'object' && typeof v.fetch === 'function' && !(v instanceof D1Database) && !(v instanceof WorkerQueue)) env[k] = limits.service(v);
  }
  return env;
}
