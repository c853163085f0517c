// D1 faults: the failures a Worker meets from D1 in production, injected on
// a chosen fraction of the Worker's D1 calls (one call: a query or a batch,
// one round trip to the relay, relay.mjs).
//
//   --d1-fault RATE            fraction of calls that fail (0..1; default 0: none)
//   --d1-fault-kinds K,K,...   which failures, drawn uniformly (repeat a kind to
//                              weight it); default: lost-before,lost-after,overloaded
//   --d1-latency-ms N          every call first waits a random 0..N ms (default 0)
//   --d1-rtt-ms N              every call first waits exactly N ms: the network
//                              round trip to D1, calls overlapping (default 0)
//   --d1-busy-ms N             every call holds its database N ms, one call at a
//                              time per database: D1 runs one query at a time,
//                              ~1 ms each (CLOUDFLARE.md) (default 0)
//   --d1-seed N                seeds the draws (default: random); the ready line says it
//
// The kinds, each with the message D1 gives (workerd's d1-api.ts raises
// `new Error("D1_ERROR: " + message, {cause: new Error(message)})` for an
// error D1 answers; Python sees "Error: D1_ERROR: ..."):
//   lost-before  "Network connection lost." before the call reaches D1: nothing ran.
//   lost-after   the call ran and committed, then its reply is lost: the same
//                "Network connection lost.", so the caller cannot tell the two apart.
//   overloaded   "D1 DB is overloaded. Too many requests queued." before the call:
//                nothing ran. (D1's docs say to retry the first, not this one.)
//
// Only the Worker's invocations meet faults (fetch, scheduled, RPC): not the
// host's own calls (migrations) nor the /__test/python hook, which tests use
// to look at the database. A faulted call still counts as a subrequest
// (limits.mjs admits it first): it was made. Each invocation's line gets
// "d1_faults": {kind: n} when it met any; GET /__test/faults (--test-hooks)
// answers the totals, and the host prints them as a
// {"event":"d1queue.d1_faults",...} line when it shuts down. POST
// /__test/faults {"rate", "kinds", "latency_ms", "seed"} changes the settings
// of a running host (omitted: none, all kinds, 0, random).

export const NETWORK_LOST = 'Network connection lost.';
export const OVERLOADED = 'D1 DB is overloaded. Too many requests queued.';
export const KINDS = ['lost-before', 'lost-after', 'overloaded'];

/** The error workerd's D1 binding raises for an error D1 reports. */
export function d1Error(message) {
  return new Error(`D1_ERROR: ${message}`, { cause: new Error(message) });
}

// mulberry32: a small seeded generator, so a run's draws can be repeated
// (calls made concurrently draw in the order they are made).
function generator(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const key = (kind) => kind.replace('-', '_');

export class D1Faults {
  /**
   * rate: fraction of calls that fail; kinds: the failures, drawn uniformly;
   * latencyMs: each call waits 0..latencyMs ms first; seed: a 32-bit integer.
   */
  constructor(options = {}) {
    this.calls = 0; // Worker calls seen (faulted or not)
    this.counts = Object.fromEntries(KINDS.map((k) => [key(k), 0]));
    this.configure(options);
  }

  /** New settings (POST /__test/faults does this too); the counts go on. */
  configure({ rate = 0, kinds = KINDS, latencyMs = 0, rttMs = 0, busyMs = 0, seed = Math.floor(Math.random() * 2 ** 32) } = {}) {
    if (!(Number.isFinite(rate) && rate >= 0 && rate <= 1)) throw new Error('--d1-fault wants a fraction from 0 to 1');
    for (const [name, v] of [['--d1-latency-ms', latencyMs], ['--d1-rtt-ms', rttMs], ['--d1-busy-ms', busyMs]]) {
      if (!(Number.isFinite(v) && v >= 0)) throw new Error(`${name} wants a number >= 0`);
    }
    if (!(Number.isInteger(seed) && seed >= 0 && seed < 2 ** 32)) throw new Error('--d1-seed wants an integer from 0 to 2^32 - 1');
    if (!Array.isArray(kinds) || !kinds.length) throw new Error('--d1-fault-kinds names no kind');
    for (const k of kinds) {
      if (!KINDS.includes(k)) throw new Error(`--d1-fault-kinds: unknown kind '${k}' (${KINDS.join(', ')})`);
    }
    this.rate = rate;
    this.kinds = kinds;
    this.latencyMs = latencyMs;
    this.rttMs = rttMs;
    this.busyMs = busyMs;
    this.seed = seed;
    this.random = generator(seed);
  }

  get active() {
    return this.rate > 0 || this.latencyMs > 0 || this.rttMs > 0 || this.busyMs > 0;
  }

  describe() {
    if (!this.active) return 'no D1 faults';
    const parts = [];
    if (this.rate > 0) parts.push(`D1 faults on ${+(this.rate * 100).toFixed(2)}% of calls (${this.kinds.join(', ')})`);
    if (this.latencyMs > 0) parts.push(`D1 latency 0-${this.latencyMs} ms`);
    if (this.rttMs > 0) parts.push(`D1 round trip ${this.rttMs} ms`);
    if (this.busyMs > 0) parts.push(`each database busy ${this.busyMs} ms per call, one at a time`);
    return `${parts.join(', ')}, seed ${this.seed}`;
  }

  totals() {
    return { calls: this.calls, ...this.counts, seed: this.seed };
  }

  /**
   * Make D1 call `call()` (a promise-returning thunk) for invocation `inv`
   * (limits.mjs; undefined for the host's own calls), failing it as drawn.
   */
  async run(inv, call, database = '') {
    if (!this.active || !inv || inv.kind === 'test') return call();
    this.calls++;
    if (this.latencyMs > 0) {
      const ms = this.random() * this.latencyMs;
      await new Promise((resolve) => setTimeout(resolve, ms));
    }
    if (this.rttMs > 0) await sleep(this.rttMs);
    if (this.busyMs > 0) call = this.#occupying(database, call);
    if (this.rate === 0 || this.random() >= this.rate) return call();
    const kind = this.kinds[Math.floor(this.random() * this.kinds.length)];
    this.counts[key(kind)]++;
    inv.faults ??= {};
    inv.faults[key(kind)] = (inv.faults[key(kind)] ?? 0) + 1;
    if (kind === 'lost-before') throw d1Error(NETWORK_LOST);
    if (kind === 'overloaded') throw d1Error(OVERLOADED);
    try {
      await call(); // committed (or refused: the reply is lost either way)
    } catch {}
    throw d1Error(NETWORK_LOST);
  }

  /** The same object, its calls naming `database` (for --d1-busy-ms). */
  forDatabase(database) {
    return { run: (inv, call) => this.run(inv, call, database) };
  }

  #busy = new Map(); // database -> the promise its last call holds it until

  /** `call` made once `database` is free, holding it busyMs ms longer. */
  #occupying(database, call) {
    return () => {
      const previous = this.#busy.get(database) ?? Promise.resolve();
      const mine = previous.then(async () => {
        await sleep(this.busyMs);
        return call();
      });
      this.#busy.set(database, mine.then(() => {}, () => {}));
      return mine;
    };
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
