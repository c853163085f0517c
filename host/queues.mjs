// Cloudflare Queues for the host: the Python Worker's side of Miniflare's own
// Queues simulation (relay.mjs runs the producer binding and the consumer).
//
// Producer: `WorkerQueue`, the binding the Worker finds in env (the workers
// SDK wraps a binding whose constructor is named WorkerQueue, as workerd's
// is). send()/sendBatch() go to the relay Worker inside Miniflare, which
// calls its real queue producer binding: Miniflare stores and delivers.
//
// Consumer: Miniflare delivers a batch to the relay's queue() handler, which
// forwards it here; the host calls the Worker's `queue()` with a batch shaped
// like workerd's (QueueController: messages, queue, ackAll(), retryAll();
// QueueMessage: id, timestamp (a Date), body, attempts, ack(), retry()), and
// hands back one decision per message, which the relay applies with
// Miniflare's own msg.ack() / msg.retry().
//
// Decisions, as workerd documents them (Queues docs, "JavaScript APIs",
// explicit acknowledgement): a message's own ack()/retry() wins over
// ackAll()/retryAll(), the first call on it holds; a message nobody decided
// is acknowledged if the handler returned and retried if it threw.

const MAX_MESSAGE_BYTES = 128 * 1024; // Queues limits: 128 KB per message
const MAX_BATCH_MESSAGES = 100; // sendBatch: up to 100 messages...
const MAX_BATCH_BYTES = 256 * 1024; // ...and 256 KB

function encode(body) {
  // workerd: "Message body cannot be undefined". The relay carries bodies as
  // JSON (workerd's default is V8 serialization, which carries more types;
  // d1queue sends plain objects only).
  if (body === undefined) throw new TypeError('Message body cannot be undefined');
  const text = JSON.stringify(body);
  if (Buffer.byteLength(text) > MAX_MESSAGE_BYTES) {
    throw new Error(`Queue send failed: message body is larger than the ${MAX_MESSAGE_BYTES} byte limit`);
  }
  return text;
}

const plainOptions = (options) => (options == null ? {} : Object.fromEntries(Object.entries(options)));

export class WorkerQueue {
  /** `call(op, payload)`: one round trip to the relay ('queue-send'), one
   * subrequest of the invocation (limits.mjs counts it). */
  constructor(binding, call) {
    this.binding = binding;
    this.call = call;
  }

  async send(body, options) {
    const text = encode(body);
    await this.call('queue-send', { binding: this.binding, messages: [{ body: text, ...plainOptions(options) }] });
  }

  async sendBatch(messages, options) {
    const list = Array.from(messages ?? [], (m) => ({ ...plainOptions(m), body: encode(m?.body) }));
    if (list.length > MAX_BATCH_MESSAGES) throw new Error(`Queue sendBatch failed: more than ${MAX_BATCH_MESSAGES} messages`);
    const bytes = list.reduce((n, m) => n + Buffer.byteLength(m.body), 0);
    if (bytes > MAX_BATCH_BYTES) throw new Error(`Queue sendBatch failed: more than ${MAX_BATCH_BYTES} bytes`);
    await this.call('queue-send', { binding: this.binding, messages: list, options: plainOptions(options) });
  }
}

export class QueueMessage {
  constructor(raw, batch) {
    this.id = raw.id;
    this.timestamp = new Date(raw.timestamp);
    this.body = JSON.parse(raw.body);
    this.attempts = raw.attempts;
    this._batch = batch;
    this._decision = null;
  }

  ack() {
    this._decision ??= { action: 'ack' };
  }

  retry(options) {
    this._decision ??= { action: 'retry', ...(options?.delaySeconds != null ? { delaySeconds: Number(options.delaySeconds) } : {}) };
  }
}

export class QueueController {
  constructor(raw) {
    this.queue = raw.queue;
    this.messages = raw.messages.map((m) => new QueueMessage(m, this));
    this._all = null;
  }

  ackAll() {
    this._all ??= { action: 'ack' };
  }

  retryAll(options) {
    this._all ??= { action: 'retry', ...(options?.delaySeconds != null ? { delaySeconds: Number(options.delaySeconds) } : {}) };
  }

  /** One decision per message, in order, once the handler is done. */
  decisions(handlerThrew) {
    const fallback = { action: handlerThrew ? 'retry' : 'ack' };
    return this.messages.map((m) => m._decision ?? this._all ?? fallback);
  }
}

/** Queue sends made to fail, as a Queues send can (POST /__test/queue-faults). */
export class QueueSendFaults {
  constructor() {
    this.failSends = 0; // the next N sends fail
    this.sends = 0;
    this.failed = 0;
  }

  /** Throws for a send that is to fail; counts every send. */
  check() {
    this.sends++;
    if (this.failSends > 0) {
      this.failSends--;
      this.failed++;
      throw new Error('Queue send failed: injected by the host (POST /__test/queue-faults)');
    }
  }

  totals() {
    return { sends: this.sends, failed: this.failed, fail_sends: this.failSends };
  }
}
