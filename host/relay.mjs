// Miniflare's D1, one round trip per query or batch.
//
// getPlatformProxy() hands Node a proxy on which every call (prepare, bind,
// run) is its own trip into workerd: ~8 ms per statement, so a batch of 25
// cost ~200 ms and the host's timings said nothing about d1queue. Instead a
// tiny relay Worker runs inside Miniflare next to the real D1 binding: the
// host sends it a whole query or batch as JSON ({sql, params} per statement)
// and it calls the binding locally, as the Worker would in production. The
// SQL runs in Miniflare's real D1 (same file as `wrangler d1 ... --local`,
// same meta.rows_read / rows_written); errors keep D1's messages.
//
// The round trips leave the main thread: a worker thread posts them to the
// relay over plain HTTP (keep-alive). Miniflare's dispatchFetch cost ~3.5 ms
// of main-thread CPU per query, Node's http ~1 ms; a message to the thread
// costs next to nothing, so the main thread's CPU (what limits.mjs measures)
// is the Worker's own, as D1's work is elsewhere in production.
import { Worker } from 'node:worker_threads';
import { Miniflare, convertV4MiniflareOptions } from 'miniflare';

// The worker thread: {id, body} in, {id, status, text} or {id, error} out.
const CLIENT = `
const http = require('node:http');
const { parentPort, workerData } = require('node:worker_threads');
const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });
parentPort.on('message', ({ id, body }) => {
  const req = http.request(workerData.url, {
    method: 'POST', agent,
    headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
  }, (res) => {
    const chunks = [];
    res.on('data', (c) => chunks.push(c));
    res.on('end', () => parentPort.postMessage({ id, status: res.statusCode, text: Buffer.concat(chunks).toString('utf8') }));
    res.on('error', (e) => parentPort.postMessage({ id, error: String(e && e.message) }));
  });
  req.on('error', (e) => parentPort.postMessage({ id, error: String(e && e.message) }));
  req.end(body);
});`;

// The relay Worker. Besides D1 it is the host's Cloudflare Queues (Miniflare's
// own simulation, not a home-made queue; queues.mjs): 'queue-send' sends with
// its real producer binding, and its queue() handler, the consumer of the
// config's queues, forwards each batch Miniflare delivers to the host
// (__D1QUEUE_HOST, a function binding running in Node), which runs the Python
// Worker's queue() and answers one decision per message, applied here with
// Miniflare's own ack() / retry(). If the host fails to answer, the handler
// throws and Miniflare delivers the whole batch again.
const RELAY = `
export default {
  async queue(batch, env) {
    const messages = batch.messages.map((m) => ({
      id: m.id, timestamp: m.timestamp.getTime(), body: JSON.stringify(m.body), attempts: m.attempts,
    }));
    const answer = await env.__D1QUEUE_HOST.fetch('http://host/queue', {
      method: 'POST', body: JSON.stringify({ queue: batch.queue, messages }),
    });
    if (answer.status !== 200) throw new Error('the host could not run the batch: ' + (await answer.text()));
    const { decisions } = await answer.json();
    batch.messages.forEach((m, i) => {
      const d = decisions[i];
      if (d.action === 'ack') m.ack();
      else m.retry(d.delaySeconds == null ? undefined : { delaySeconds: d.delaySeconds });
    });
  },
  async fetch(request, env) {
    const { binding, op, stmts, arg, payload } = await request.json();
    if (op === 'ratelimit') {
      // Miniflare's own Rate Limiting binding (per key, fixed windows of its period).
      const out = await env[payload.binding].limit({ key: payload.key });
      return Response.json({ ok: true, out });
    }
    if (op === 'queue-send') {
      try {
        const { messages, options } = payload;
        await env[payload.binding].sendBatch(messages.map((m) => ({ ...m, body: JSON.parse(m.body), contentType: 'json' })), options);
        return Response.json({ ok: true, out: null });
      } catch (e) {
        return Response.json({ ok: false, message: String(e && e.message), cause: null });
      }
    }
    const db = env[binding];
    const prep = (s) => db.prepare(s.sql).bind(...s.params);
    try {
      let out;
      if (op === 'batch') out = await db.batch(stmts.map(prep));
      else if (op === 'exec') out = await db.exec(stmts[0].sql);
      else if (op === 'first') out = arg == null ? await prep(stmts[0]).first() : await prep(stmts[0]).first(arg);
      else if (op === 'raw') out = arg == null ? await prep(stmts[0]).raw() : await prep(stmts[0]).raw(arg);
      else out = await prep(stmts[0])[op]();
      return Response.json({ ok: true, out: out === undefined ? null : out });
    } catch (e) {
      const cause = e && e.cause ? String(e.cause.message ?? e.cause) : null;
      return Response.json({ ok: false, message: String(e && e.message), cause });
    }
  },
};`;

/** Start Miniflare with the relay and the config's D1 databases and queues, stored under
 * `persistRoot` (DIR of `--persist-to DIR`: the file is DIR/v3/d1/…, as
 * wrangler's local D1 commands lay it out). `workerOptions` comes from
 * wrangler's unstable_getMiniflareWorkerOptions (D1 ids as wrangler picks
 * them, and its queueProducers / queueConsumers). `onQueueBatch({queue,
 * messages})` runs a delivered batch and resolves to its decisions. Returns
 * {mf, relay, queueCall}; relay(binding)(op, body, arg) runs one D1 call
 * (`body`: the statements as JSON) and gives the answer's text (decodeAnswer);
 * queueCall(op, payload) one Queues call (queues.mjs). */
export async function startMiniflare(workerOptions, persistRoot, onQueueBatch = null) {
  const d1Databases = Object.fromEntries(
    Object.entries(workerOptions.d1Databases ?? {}).map(([name, db]) => [name, typeof db === 'string' ? db : db.id]),
  );
  const mf = new Miniflare(
    convertV4MiniflareOptions({
      modules: true,
      script: RELAY,
      compatibilityDate: workerOptions.compatibilityDate ?? '2025-01-01',
      resourcePersistencePath: `${persistRoot}/v3`,
      d1Databases,
      queueProducers: workerOptions.queueProducers,
      queueConsumers: workerOptions.queueConsumers,
      ratelimits: workerOptions.ratelimits,
      serviceBindings: {
        __D1QUEUE_HOST: async (request) => {
          if (!onQueueBatch) return new Response('this host runs no queue consumer', { status: 503 });
          try {
            return Response.json({ decisions: await onQueueBatch(await request.json()) });
          } catch (e) {
            return new Response(String(e?.stack ?? e), { status: 500 });
          }
        },
      },
    }),
  );
  const url = String(await mf.ready);
  const client = new Worker(CLIENT, { eval: true, workerData: { url } });
  const waiting = new Map(); // id -> {resolve, reject}
  let nextId = 0;
  client.on('message', ({ id, status, text, error }) => {
    const w = waiting.get(id);
    waiting.delete(id);
    if (error !== undefined) w.reject(new Error(`D1 relay: ${error}`));
    else if (status !== 200) w.reject(new Error(`D1 relay answered ${status}: ${text.slice(0, 200)}`));
    else w.resolve(text);
  });
  client.on('error', (e) => { for (const w of waiting.values()) w.reject(e); waiting.clear(); });
  const dispose = mf.dispose.bind(mf);
  mf.dispose = async () => { await client.terminate(); return dispose(); };
  const roundTrip = (body) => new Promise((resolve, reject) => {
    const id = nextId++;
    waiting.set(id, { resolve, reject });
    client.postMessage({ id, body });
  });
  // The envelope around the statements' JSON (made by the binding, d1.mjs)
  // is the host's: built here, by concatenation, after the Worker's step
  // (limits.mjs offStep). The answer's text goes back as it came: the
  // binding's side parses it (decodeAnswer).
  const relay = (binding) => {
    const head = `{"binding":${JSON.stringify(binding)},"op":`;
    return (op, body, arg = null) =>
      roundTrip(`${head}${JSON.stringify(op)},"arg":${JSON.stringify(arg ?? null)},"stmts":${body}}`);
  };
  const queueCall = async (op, payload) => {
    const answer = JSON.parse(await roundTrip(JSON.stringify({ op, payload })));
    if (!answer.ok) throw new Error(answer.message);
    return answer.out;
  };
  return { mf, relay, queueCall };
}

/** The relay's answer as the binding's result, or D1's error thrown: what
 * workerd's binding does with D1's answer in the isolate (d1-api.ts toJson,
 * mapD1Result, toArrayOfObjects), so it is charged to the Worker
 * (limits.mjs d1). */
export function decodeAnswer(text) {
  const answer = JSON.parse(text);
  if (!answer.ok) {
    throw new Error(answer.message, answer.cause ? { cause: new Error(answer.cause) } : undefined);
  }
  return answer.out;
}
