// The host's HTTP server (node:http, 127.0.0.1).
//
// Routes: everything goes to the Worker's `fetch`, except
//   GET /__scheduled?cron=…, GET /cdn-cgi/handler/scheduled?cron=…  → `scheduled`
//       (cron: the config's first cron by default; time: the scheduled time
//       in ms, now by default)
//   with --test-hooks, /__test/… (hooks.mjs)
//
// As at Cloudflare: a method the Fetch standard forbids is answered 405 by the
// host itself, an invocation out of CPU is answered 503 (1102) for a fetch and
// 500 for a scheduled run, and a Worker that throws gets a 500.

import http from 'node:http';
import { bodyStream, discard } from './body.mjs';
import { CPU_EXCEEDED } from './limits.mjs';
import { oneError } from './lifecycle.mjs';

// Cloudflare's answer when an invocation ran out of CPU: error 1102.
export const CPU_EXCEEDED_BODY = `${CPU_EXCEEDED} (error code: 1102)\n`;

/** A whole answer of the host's own. */
export function text(res, status, body, type = 'text/plain; charset=utf-8') {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

// The Worker gets the body as a stream (body.mjs): it may answer (a 401, say)
// without the host ever reading what the client sends.
async function toRequest(req, port) {
  const url = new URL(req.url, `http://${req.headers.host ?? `127.0.0.1:${port}`}`);
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  const hasBody = !['GET', 'HEAD'].includes(req.method);
  if (!hasBody) return new Request(url, { method: req.method, headers });
  return new Request(url, { method: req.method, headers, body: bodyStream(req), duplex: 'half' });
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

// Methods the Fetch standard forbids: no Request can carry them, so they never
// reach a Worker (Cloudflare's edge refuses them too). Answered here as a 405.
const FORBIDDEN_METHODS = new Set(['CONNECT', 'TRACE', 'TRACK']);

async function runFetch(worker, port, req, res) {
  if (FORBIDDEN_METHODS.has(req.method)) {
    // What the path does accept, as the Worker answers OPTIONS (if it does).
    const event = worker.begin();
    let allow = '';
    try {
      const probe = new Request(new URL(req.url, `http://${req.headers.host ?? 'localhost'}`), { method: 'OPTIONS' });
      allow = (await event.call(true, 'fetch', probe)).headers.get('allow') ?? '';
    } finally {
      event.close();
    }
    res.writeHead(405, { 'content-type': 'application/json', ...(allow ? { allow } : {}) });
    return res.end(JSON.stringify({ error: { code: 'method_not_allowed', message: `${req.method} is not allowed` } }));
  }
  const request = await toRequest(req, port);
  const event = worker.begin();
  try {
    const response = await event.call(true, 'fetch', request);
    // What the Worker left of the body is drained before the answer goes
    // out: a client still sending it (a 413 answered from Content-Length)
    // would otherwise meet a connection closed under it (EPIPE).
    discard(req);
    if (!(response instanceof Response)) throw new TypeError(`fetch returned ${response} instead of a Response`);
    if (event.outcome === 'exceededCpu') text(res, 503, CPU_EXCEEDED_BODY);
    else await send(res, response, req.method);
  } catch (e) {
    if (event.outcome !== 'exceededCpu') throw e;
    text(res, 503, CPU_EXCEEDED_BODY);
  } finally {
    event.close(); // the response does not wait for the waitUntil work
    discard(req);
  }
}

/**
 * The server for `worker` (worker.mjs). `port`: the --port asked for (the
 * Host a request without one is taken to have named); `crons`: the config's
 * (cron.mjs parseCrons); `hooks(url, req, res)`: the /__test/ routes
 * (hooks.mjs), resolving true when one answered, or null.
 */
export function createServer({ worker, port, crons, hooks = null }) {
  return http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://host');
      if (url.pathname === '/__scheduled' || url.pathname === '/cdn-cgi/handler/scheduled') {
        const cron = url.searchParams.get('cron') ?? crons[0]?.expr ?? '* * * * *';
        const time = Number(url.searchParams.get('time') ?? Date.now());
        const outcome = await worker.scheduled(cron, time);
        if (outcome === 'exceededCpu') return text(res, 500, CPU_EXCEEDED_BODY);
        return outcome === 'ok' ? text(res, 200, 'Ran scheduled event') : text(res, 500, `Scheduled event outcome: ${outcome}\n`);
      }
      if (hooks && (await hooks(url, req, res))) return;
      await runFetch(worker, port, req, res);
    } catch (e) {
      process.stderr.write(`${oneError(e)}\n`);
      if (!res.headersSent) text(res, 500, `Worker threw exception: ${e.message}\n`);
      else res.destroy();
    }
  });
}
