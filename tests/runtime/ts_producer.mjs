// Runs examples/ts-producer (compiled to JS) in workerd through Miniflare,
// its QUEUE service binding reaching the d1queue Worker served by the
// offline host. The host is a Node process, not workerd, so the binding's
// target is a JS WorkerEntrypoint shim inside Miniflare whose every RPC
// method forwards its arguments to the host's POST /__test/rpc/<method>
// hook and answers its result (or throws its error message, as RPC does).
//
//   node ts_producer.mjs <host url> <producer.js> '<methods JSON>' < requests.json
//
// stdin: a JSON array of request bodies (strings, sent as they are), each
// POSTed to the producer in turn; stdout: {answers, rpc}, answers a JSON
// array of {status, body}, rpc the RPC methods the producer called, in order.
import { readFileSync } from 'node:fs';
import { Miniflare, convertV4MiniflareOptions } from 'miniflare';

const [hostUrl, producerPath, methodsJson] = process.argv.slice(2);
const methods = JSON.parse(methodsJson);
const requests = JSON.parse(readFileSync(0, 'utf8'));
const rpc = [];

// Explicit methods (not prototype assignments): workerd exposes a class's
// own declared methods over RPC.
const SHIM = `
import { WorkerEntrypoint } from 'cloudflare:workers';
async function forward(env, name, args) {
  const answer = await env.HOST.fetch('http://host/__test/rpc/' + name, {
    method: 'POST', body: JSON.stringify(args),
  });
  const reply = await answer.json();
  if (!reply.ok) throw new Error(reply.error);
  return reply.result;
}
export default class D1QueueShim extends WorkerEntrypoint {
${methods.map((m) => `  async ${m}(...args) { return forward(this.env, ${JSON.stringify(m)}, args); }`).join('\n')}
}
`;

const mf = new Miniflare(
  convertV4MiniflareOptions({
    workers: [
      {
        name: 'd1queue-ts-producer',
        modules: true,
        script: readFileSync(producerPath, 'utf8'),
        compatibilityDate: '2026-11-01',
        serviceBindings: { QUEUE: 'd1queue' },
      },
      {
        name: 'd1queue',
        modules: true,
        script: SHIM,
        compatibilityDate: '2026-11-01',
        serviceBindings: {
          // A Node function: the host's test hook, reached from Node.
          HOST: async (request) => {
            const url = new URL(request.url);
            rpc.push(url.pathname.split('/').pop());
            const reply = await fetch(hostUrl + url.pathname, { method: 'POST', body: await request.text() });
            return new Response(await reply.text(), { status: reply.status });
          },
        },
      },
    ],
  }),
);
try {
  const out = [];
  for (const body of requests) {
    const res = await mf.dispatchFetch('http://producer/', { method: 'POST', body });
    out.push({ status: res.status, body: await res.json() });
  }
  process.stdout.write(JSON.stringify({ answers: out, rpc }));
} finally {
  await mf.dispose();
}
