// Consumer lanes. Miniflare's Queues deliver one batch at a time per queue;
// Cloudflare runs up to the consumer's max_concurrency invocations at once.
// With --consumer-lanes N each consumed queue becomes N Miniflare queues
// (the queue itself and "<queue>-lane-1"...), each delivering on its own, the
// producer binding spreads its send calls over them in turn, and the Worker's
// queue() sees the queue's own name: up to N consumer invocations at once,
// each message still stored, delivered, acked and retried by Miniflare.
// `--consumer-lanes max`: the config's consumer max_concurrency (make dev).

import { MAX_LANES } from './cli.mjs';

const laneName = (name, i) => (i === 0 ? name : `${name}-lane-${i}`);

export class ConsumerLanes {
  /** `lanes`: a number, or 'max' for the highest max_concurrency of the
   * config's [[queues.consumers]]. */
  constructor(lanes, config) {
    const maxConcurrency = Math.max(1, ...(config.queues?.consumers ?? []).map((c) => c.max_concurrency ?? 1));
    this.count = lanes === 'max' ? Math.min(maxConcurrency, MAX_LANES) : lanes;
    this.queueOfLane = new Map(); // a lane's Miniflare queue name -> the queue's own name
    this.bindings = new Map(); // producer binding -> its lanes' bindings
    this.turn = new Map(); // producer binding -> the next lane to send on
  }

  /** Miniflare's worker options (wrangler's) with each queue and producer
   * binding made `count` lanes. */
  apply(options) {
    const n = this.count;
    if (n === 1) return options;
    const producers = {};
    for (const [binding, p] of Object.entries(options.queueProducers ?? {})) {
      const names = [];
      for (let i = 0; i < n; i++) {
        producers[laneName(binding, i)] = { ...p, queueName: laneName(p.queueName, i) };
        names.push(laneName(binding, i));
      }
      this.bindings.set(binding, names);
    }
    const consumers = {};
    for (const [queue, c] of Object.entries(options.queueConsumers ?? {})) {
      for (let i = 0; i < n; i++) {
        consumers[laneName(queue, i)] = c;
        this.queueOfLane.set(laneName(queue, i), queue);
      }
    }
    return { ...options, queueProducers: producers, queueConsumers: consumers };
  }

  /** The lane binding a send on producer `binding` goes to: each in turn. */
  next(binding) {
    const names = this.bindings.get(binding);
    if (!names) return binding;
    const turn = this.turn.get(binding) ?? 0;
    this.turn.set(binding, (turn + 1) % names.length);
    return names[turn];
  }

  /** The queue a lane's Miniflare queue stands for. */
  queueOf(name) {
    return this.queueOfLane.get(name) ?? name;
  }
}
