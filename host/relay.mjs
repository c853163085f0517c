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
import { Miniflare, convertV4MiniflareOptions } from 'miniflare';

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
 * them). Returns {mf, relay}; relay(binding)(op, stmts, arg) runs one call. */
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
  await mf.ready;
  const relay = (binding) => async (op, stmts, arg = null) => {
    const response = await mf.dispatchFetch('http://relay/', {
      method: 'POST',
      body: JSON.stringify({ binding, op, stmts, arg }),
    });
    const answer = await response.json();
    if (!answer.ok) {
      throw new Error(answer.message, answer.cause ? { cause: new Error(answer.cause) } : undefined);
    }
    return answer.out;
  };
  return { mf, relay };
}
