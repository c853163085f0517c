// The test hooks (--test-hooks): routes the tests drive the Worker and the
// host through. Each Worker call is an invocation of its own, with the plan's
// limits (limits.mjs).
//
//   POST /__test/python (body: `async def main(env)` source)
//   GET  /__test/idle   (answers once all waitUntil work is done)
//   POST /__test/rpc/<method> (body: JSON array of arguments)
//   GET  /__test/faults (the D1 faults injected so far, by kind)
//   POST /__test/queue-faults (body: {"fail_sends": N}: the next N queue
//         sends fail, as a Queues send can; answers the sends seen and failed)
//   POST /__test/faults (body: {"rate", "kinds", "latency_ms", "seed"}: new settings)
//   GET  /__test/analytics (the Analytics Engine data points written so far)

import v8 from 'node:v8';
import { readBody } from './body.mjs';
import { CPU_EXCEEDED } from './limits.mjs';
import { CPU_EXCEEDED_BODY, text } from './server.mjs';

const json = (res, status, value) => text(res, status, typeof value === 'string' ? value : JSON.stringify(value), 'application/json');

// POST /__test/python: the source's `main(env)` run in the Worker; answers
// what pyhost.py's run_test reports.
async function runTestPython(worker, req, res) {
  const source = await readBody(req);
  const event = worker.begin('test');
  try {
    const answer = await event.runTest(source);
    if (!event.waiting) await event.ended(); // no waitUntil work: its lines before the answer
    if (event.outcome !== 'exceededCpu') return json(res, 200, answer);
    // Out of CPU: the invocation failed (503, as a fetch); what Python saw is in `detail`.
    json(res, 503, { ok: false, outcome: event.outcome, error: CPU_EXCEEDED_BODY.trim(), detail: JSON.parse(answer) });
  } finally {
    event.close();
  }
}

// POST /__test/rpc/<method>, body a JSON array of arguments: the call a JS
// Worker makes through a service binding (env.QUEUE.<method>(...args)), with
// workerd's conversions; answers {ok, result} or {ok: false, error}.
async function runTestRpc(worker, name, req, res) {
  let args = JSON.parse((await readBody(req)) || '[]');
  try {
    // Workers RPC carries arguments by V8's structured clone, in the calling
    // Worker: a value it cannot serialize (nested a few thousand levels deep,
    // say) fails there and never reaches this Worker.
    args = v8.deserialize(v8.serialize(args));
  } catch (e) {
    return json(res, 200, { ok: false, error: `the caller could not send the arguments: ${e.name}: ${e.message}` });
  }
  const event = worker.begin('rpc');
  try {
    const result = await event.call(false, name, ...args);
    if (!event.waiting) await event.ended(); // no waitUntil work: its lines before the answer
    if (event.outcome === 'exceededCpu') throw new Error(CPU_EXCEEDED);
    json(res, 200, { ok: true, result: result ?? null });
  } catch (e) {
    const error = event.outcome === 'exceededCpu' ? CPU_EXCEEDED : String(e.message ?? e);
    json(res, 200, { ok: false, error });
  } finally {
    event.close();
  }
}

/** The hooks as server.mjs takes them: (url, req, res) resolving true when a
 * hook answered. `faults`: the D1Faults (faults.mjs); `queueFaults`: the
 * QueueSendFaults (queues.mjs); `pending`: worker.mjs's Pending. */
export function testHooks({ worker, faults, queueFaults, pending, analytics }) {
  return async (url, req, res) => {
    if (url.pathname === '/__test/python' && req.method === 'POST') {
      await runTestPython(worker, req, res);
      return true;
    }
    if (url.pathname.startsWith('/__test/rpc/') && req.method === 'POST') {
      await runTestRpc(worker, url.pathname.slice('/__test/rpc/'.length), req, res);
      return true;
    }
    if (url.pathname === '/__test/faults') {
      if (req.method === 'POST') {
        const body = await readBody(req);
        try {
          const { rate, kinds, latency_ms: latencyMs, seed } = JSON.parse(body || '{}');
          faults.configure({ rate, kinds, latencyMs, seed });
        } catch (e) {
          text(res, 400, `${e.message}\n`);
          return true;
        }
      }
      json(res, 200, faults.totals());
      return true;
    }
    if (url.pathname === '/__test/queue-faults') {
      if (req.method === 'POST') {
        const { fail_sends: n = 0 } = JSON.parse((await readBody(req)) || '{}');
        queueFaults.failSends = Number(n);
      }
      json(res, 200, queueFaults.totals());
      return true;
    }
    if (url.pathname === '/__test/analytics') {
      json(res, 200, analytics.points);
      return true;
    }
    if (url.pathname === '/__test/idle') {
      await pending.settle();
      text(res, 200, 'idle');
      return true;
    }
    return false;
  };
}
