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

const RELAY = `
export default {
  async fetch(request, env) {
    const { binding, op, stmts, arg } = await request.json();
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

/** Start Miniflare with the relay and the config's D1 databases, stored under
 * `persistRoot` (DIR of `--persist-to DIR`: the file is DIR/v3/d1/…, as
 * wrangler's local D1 commands lay it out). `workerOptions` comes from
 * wrangler's unstable_getMiniflareWorkerOptions (D1 ids as wrangler picks
 * them). Returns {mf, relay}; relay(binding)(op, body, arg) runs one call
 * (`body`: the statements as JSON) and gives the answer's text (decodeAnswer). */
export async function startMiniflare(workerOptions, persistRoot) {
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
  return { mf, relay };
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
