// The one place the host reads request bodies.
//
// The Worker gets its body as a stream (bodyStream), as workerd hands it one:
// a client may send any size, and what the Worker does not read (a request it
// answers 401 without reading, say) is never held here, only drained
// (discard). The host's own routes (hooks.mjs) read theirs whole (readBody).

/** The whole body as UTF-8 text. Past `limit` bytes it is still drained, so
 * the connection can answer, but no more is kept and the promise rejects. */
export async function readBody(req, limit = Infinity) {
  const chunks = [];
  let size = 0;
  // Not `break` past the limit: leaving a for-await destroys the request and
  // its socket, and the answer could no longer be sent.
  for await (const chunk of req) {
    size += chunk.length;
    if (size <= limit) chunks.push(chunk);
  }
  if (size > limit) throw new RangeError(`request body over ${limit} bytes`);
  return Buffer.concat(chunks).toString('utf8');
}

/** The body as a ReadableStream the Worker reads: chunk by chunk on demand
 * (highWaterMark 0: nothing is read ahead); cancelled, the rest is
 * discarded. */
export function bodyStream(req) {
  const next = () => new Promise((resolve) => {
    const on = () => {
      req.off('readable', on);
      req.off('end', on);
      req.off('error', on);
      resolve();
    };
    req.on('readable', on);
    req.on('end', on);
    req.on('error', on);
  });
  return new ReadableStream({
    async pull(controller) {
      for (;;) {
        if (req.errored) return controller.error(req.errored);
        const chunk = req.read();
        if (chunk !== null) return controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
        if (req.readableEnded) return controller.close();
        await next();
      }
    },
    cancel() {
      discard(req);
    },
  }, { highWaterMark: 0 });
}

/** What the Worker left unread: drained and dropped (never buffered), so the
 * connection can answer and be reused. */
export function discard(req) {
  if (req.readableEnded || req.destroyed) return;
  req.removeAllListeners('readable');
  req.resume();
}
