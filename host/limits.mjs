// Limits mode: Cloudflare's per-invocation limits, enforced by the host.
//
// An invocation is one fetch, one scheduled run, one RPC call or one test-hook
// call, together with its waitUntil work. Each gets an Invocation, carried
// through everything the Worker does for it by Node's AsyncLocalStorage:
// Pyodide schedules Python's event loop on setImmediate / MessageChannel /
// setTimeout and awaits JS promises with .then(), all of which keep the
// context (checked on Pyodide 314 and 0.28: call_soon, call_later, awaited
// JS promises, asyncio.gather'd and create_task'd tasks, ctx.waitUntil work
// and print() all see the invocation that started them, with three
// invocations interleaved). So a D1 call, a fetch or a service-binding call
// is attributed by looking up the store when it is made; calls with no
// invocation (the host's own migrations) are not counted.
//
// What an invocation may do (Workers and D1 "limits" docs; ../shared/CLOUDFLARE.md):
// - subrequests: free 50 in all (D1 queries included); paid 10,000, of which
//   at most 1,000 D1 queries. Each D1 call (.all/.run/.first/.raw/.exec) or
//   db.batch is one subrequest and one D1 query; each outbound fetch (the JS
//   global `fetch`, where the workers SDK's fetch ends) is one; each call on a
//   service binding is one. Past the cap the call fails, as Cloudflare's does:
//     fetch / service binding: "Too many subrequests by single Worker invocation."
//     D1 (a binding's API call): "Too many API requests by single worker invocation."
//   These are the runtime's words as Workers' logs show them (production
//   reports quoted in many public repositories; the enforcing code is not in
//   open-source workerd, whose LimitEnforcer is a stub). workerd's
//   d1-api.ts sends D1 calls through the binding's fetcher (`_wrappedFetch`
//   outside its try), so the limit error reaches the caller unwrapped.
// - CPU: free 10 ms, paid 30 s, measured as the CPU time of the thread the
//   Worker runs on (see cpuNow) while the Worker's own code runs: the call that
//   starts a handler and every step of Pyodide's event loop (worker.mjs routes
//   its scheduleCallback through timed()), and the parsing of each D1 answer
//   with the promise reactions that hand it to Python (d1()), charged to the
//   invocation they belong to, waitUntil work included. The host's own work
//   (its accounting, the D1 relay's transport: d1()), HTTP serving and
//   outbound fetch are not counted, as
//   workerd does it off the isolate. Node is not workerd: --cpu warn. Past it
//   the invocation's next I/O throws and its outcome is `exceededCpu`: a
//   fetch is answered 503, error 1102 "Worker exceeded CPU time limit."
//   (Workers docs, observability/errors); in Python the error reads
//   "CpuLimitExceeded: Python Worker exceeded CPU time limit", what workerd
//   raises in a Python Worker (src/pyodide/internal/introspection.py).
// - waitUntil: work may go on 30 s after the response, then it is cancelled
//   (its later I/O fails) and the host logs workerd's warning
//   (io-context.c++ IncomingRequest::drain). A scheduled run, its waitUntil
//   work included, may take 15 min of wall time, then it is cut the same way.
//
// At its end every invocation prints one JSON line,
//   {"event":"d1queue.invocation","kind":..,"plan":..,"cpu_ms":..,"main_thread_cpu_ms":..,
//    "process_cpu_ms":..,"wall_ms":..,"subrequests":..,"d1_queries":..,"outcome":..}
// (with "d1_faults": {kind: n} when --d1-fault failed some of its D1 calls: faults.mjs)
// and the drain's report lines ("event": "d1queue.drain") printed during it
// are held and printed then, with "cpu_ms", "host_subrequests" and
// "host_d1_queries" added (the invocation's totals; the drain's own
// "subrequests" is left as the Worker wrote it).

import { AsyncLocalStorage } from 'node:async_hooks';
import fs from 'node:fs';

export const PLANS = {
  free: { subrequests: 50, d1Queries: 50, cpuMs: 10 },
  paid: { subrequests: 10_000, d1Queries: 1_000, cpuMs: 30_000 },
};

// Analytics Engine data points an invocation may write (its limits page).
export const DATA_POINTS = 250;
export const TOO_MANY_DATA_POINTS = `Analytics Engine takes at most ${DATA_POINTS} data points per invocation.`;
export const TOO_MANY_SUBREQUESTS = 'Too many subrequests by single Worker invocation.';
export const TOO_MANY_API_REQUESTS = 'Too many API requests by single worker invocation.';
export const CPU_EXCEEDED = 'Worker exceeded CPU time limit.'; // error 1102
const PYTHON_CPU_EXCEEDED = 'Python Worker exceeded CPU time limit';
const WAIT_UNTIL_CANCELLED =
  'waitUntil() tasks did not complete within the allowed time after invocation end and have been cancelled. ' +
  'See: https://developers.cloudflare.com/workers/runtime-apis/context/#waituntil';

const LATE = Symbol('late');

// The clock every step of the Worker is timed with: the CPU time of the
// thread that runs it, Node's main thread (CLOCK_THREAD_CPUTIME_ID), as
// workerd charges a request the CPU of the isolate's thread. Node has no call
// for that clock but reaches it through WASI's clock_time_get (uvwasi calls
// clock_gettime(CLOCK_THREAD_CPUTIME_ID)): a 17-byte function below reads it,
// to the nanosecond, for ~1 us. Not the process's clock (getrusage
// RUSAGE_SELF), which counts every thread while a step runs: the D1 relay's
// client thread (the host's transport, which in production is not the
// Worker's) and V8's compiler and GC helper threads (measured: a 30 us step
// read 31 us on the thread clock and up to 2,363 us on the process clock
// while another thread was busy). Not process.threadCpuUsage (RUSAGE_THREAD)
// either: it moves in scheduler ticks on these machines (4 ms steps, checked
// on kernel 6.18). Where WASI is missing, the process clock stands in: an
// overcount, never an undercount.
const THREAD_CLOCK_WASM = (() => {
  const name = (s) => [s.length, ...Buffer.from(s)];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
    // types: (i32, i64, i32) -> i32 (clock_time_get); () -> f64 (now)
    0x01, 0x0c, 0x02, 0x60, 0x03, 0x7f, 0x7e, 0x7f, 0x01, 0x7f, 0x60, 0x00, 0x01, 0x7c,
    0x02, 0x29, 0x01, ...name('wasi_snapshot_preview1'), ...name('clock_time_get'), 0x00, 0x00,
    0x03, 0x02, 0x01, 0x01, // one function of type 1
    0x05, 0x03, 0x01, 0x00, 0x01, // one page of memory
    0x07, 0x10, 0x02, ...name('memory'), 0x02, 0x00, ...name('now'), 0x00, 0x01,
    // now(): clock_time_get(3 = THREAD_CPUTIME_ID, precision 1, into [0]); f64(load [0])
    0x0a, 0x13, 0x01, 0x11, 0x00, 0x41, 0x03, 0x42, 0x01, 0x41, 0x00, 0x10, 0x00, 0x1a,
    0x41, 0x00, 0x29, 0x03, 0x00, 0xba, 0x0b,
  ]);
})();

const processNow = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000; // ms
};

async function threadClock() {
  const warn = process.emitWarning; // WASI is "experimental": no warning line in the host's output
  process.emitWarning = () => {};
  try {
    const { WASI } = await import('node:wasi');
    const wasi = new WASI({ version: 'preview1' });
    const instance = new WebAssembly.Instance(new WebAssembly.Module(THREAD_CLOCK_WASM), wasi.getImportObject());
    wasi.initialize(instance);
    const now = instance.exports.now;
    const a = now();
    if (!(a > 0)) return null;
    return () => now() / 1e6; // ms
  } catch {
    return null;
  } finally {
    process.emitWarning = warn;
  }
}

const threadNow = await threadClock();
export const CPU_CLOCK = threadNow ? 'main thread (CLOCK_THREAD_CPUTIME_ID)' : 'process (getrusage)';
const cpuNow = threadNow ?? processNow;

// The main thread's CPU over an invocation's whole span, for the invocation
// line's cross-check: the thread clock, else the scheduler's own sum in
// /proc/thread-self/sched where Linux has it (a read costs ~13 us), else the
// tick-granular thread clock.
const mainNow = threadNow ?? (() => {
  let fd = null;
  const buf = Buffer.alloc(8192);
  try {
    fd = fs.openSync('/proc/thread-self/sched', 'r');
  } catch {}
  const fromSched = () => {
    const n = fs.readSync(fd, buf, 0, buf.length, 0);
    const m = /se\.sum_exec_runtime\s*:\s*([\d.]+)/.exec(buf.toString('latin1', 0, n));
    return m ? Number(m[1]) : NaN; // ms
  };
  if (fd !== null && Number.isFinite(fromSched())) return fromSched;
  if (typeof process.threadCpuUsage !== 'function') return () => NaN;
  return () => {
    const { user, system } = process.threadCpuUsage();
    return (user + system) / 1000;
  };
})();

function cpuError() {
  const e = new Error(PYTHON_CPU_EXCEEDED);
  e.name = 'CpuLimitExceeded';
  return e;
}

export class Limits {
  /**
   * enabled: false (--no-limits) keeps the bookkeeping but enforces and prints nothing.
   * plan: 'free' | 'paid'; cpu: 'enforce' | 'warn'; cpuMs overrides the plan's CPU limit;
   * waitUntilS, scheduledS: the waitUntil window after the response, a scheduled run's wall time.
   */
  constructor({ enabled = true, plan = 'paid', cpu = 'enforce', cpuMs, waitUntilS = 30, scheduledS = 900,
    out = (s) => process.stdout.write(s), err = (s) => process.stderr.write(s) } = {}) {
    if (!PLANS[plan]) throw new Error(`--plan must be free or paid, not '${plan}'`);
    if (!['enforce', 'warn'].includes(cpu)) throw new Error(`--cpu must be enforce or warn, not '${cpu}'`);
    for (const [name, v] of [['--cpu-ms', cpuMs], ['--wait-until-s', waitUntilS], ['--scheduled-s', scheduledS]]) {
      if (v !== undefined && !(Number.isFinite(v) && v >= 0)) throw new Error(`${name} wants a number >= 0`);
    }
    this.enabled = enabled;
    this.plan = plan;
    this.caps = { ...PLANS[plan], ...(cpuMs !== undefined ? { cpuMs } : {}) };
    this.enforceCpu = cpu === 'enforce';
    this.waitUntilMs = waitUntilS * 1000;
    this.scheduledMs = scheduledS * 1000;
    this.out = out;
    this.err = err;
    this.als = new AsyncLocalStorage();
    this.installFetch();
  }

  describe() {
    if (!this.enabled) return 'limits off';
    const c = this.caps;
    return `${this.plan} plan limits: ${c.subrequests} subrequests, ${c.d1Queries} D1 queries, ` +
      `${c.cpuMs} ms CPU (${CPU_CLOCK} clock)${this.enforceCpu ? '' : ' (warn only)'}, waitUntil ${this.waitUntilMs / 1000} s, ` +
      `scheduled ${this.scheduledMs / 1000} s`;
  }

  /** The invocation the running code belongs to, if any. */
  current() {
    return this.als.getStore();
  }

  /** Run `fn` (one step of the Worker's code: an event-loop callback of
   * Pyodide's, or the call that starts a handler) and charge its CPU to the
   * current invocation; host work the step handed over (Invocation.offStep:
   * the D1 relay's transport) runs after it, uncharged. */
  timed(fn) {
    const inv = this.current();
    if (!inv || inv.stepStart !== null) return fn(); // no invocation, or nested
    inv.stepStart = cpuNow();
    try {
      return fn();
    } finally {
      inv.closeStep();
    }
  }

  /** A new invocation of `kind` ('fetch', 'scheduled', 'queue', 'rpc', 'test') for `ctx`. */
  begin(kind, ctx) {
    return new Invocation(this, kind, ctx);
  }

  /**
   * Wrap a D1 round trip `call(op, body, arg)` (relay.mjs: `body` is the
   * statements' JSON, made by the binding in d1.mjs; the promise gives the
   * answer's text): one subrequest and one D1 query; `faults` (faults.mjs),
   * if given, may delay or fail it; `decode(text)` turns the answer into the
   * binding's result or throws D1's error.
   *
   * What is charged to the Worker follows what workerd runs in the isolate
   * (d1-api.ts): the binding's prepare/bind and the request's
   * JSON.stringify (in d1.mjs, inside the Worker's step), and parsing D1's
   * answer (`decode`, with the promise reactions it resolves: Pyodide
   * handing the result to Python). What workerd does outside the isolate is
   * not charged, and here it is the host's own: this accounting (one
   * subrequest counted, the invocation looked up), the relay's envelope and
   * its message to the client thread, which runs after the step
   * (Invocation.offStep) so that thread's HTTP work does not run, and count
   * in the process's CPU, while the step's clock runs. */
  d1(call, faults = null, decode = (text) => text) {
    const als = this.als;
    return (op, body, arg) => {
      const inv = als.getStore();
      try {
        inv?.admit('d1');
      } catch (e) {
        return Promise.reject(e);
      }
      return new Promise((resolve, reject) => {
        const deliver = (text) => {
          let value;
          try {
            value = decode(text);
          } catch (e) {
            reject(e);
            return;
          }
          resolve(value);
        };
        const send = () => {
          let reply;
          try {
            // The relay's own I/O belongs to no invocation. run(undefined), not
            // exit(): exit() switches Node's async hooks off and on again, which
            // cost ~1.5 ms of main-thread CPU per D1 call here (V8 drops the
            // code it optimised for promises each time).
            reply = als.run(undefined, () => (faults ? faults.run(inv, () => call(op, body, arg)) : call(op, body, arg)));
          } catch (e) {
            reject(e);
            return;
          }
          reply.then((text) => (inv ? inv.charge(() => deliver(text)) : deliver(text)), reject);
        };
        if (inv && inv.stepStart !== null) inv.offStep.push(send);
        else send();
      });
    };
  }

  /** Wrap a Queues round trip `call(op, payload)` (queues.mjs): one subrequest. */
  queue(call) {
    const als = this.als;
    return async (op, payload) => {
      als.getStore()?.admit('queue');
      return als.run(undefined, () => call(op, payload)); // not exit(): see d1()
    };
  }

  /** One Analytics Engine data point (analytics.mjs) on the current
   * invocation, or the limit's error; returns the invocation's kind. Not a
   * subrequest. */
  dataPoint() {
    const inv = this.als.getStore();
    if (inv && this.enabled) {
      if (inv.dataPoints >= DATA_POINTS) throw new Error(TOO_MANY_DATA_POINTS);
      inv.dataPoints++;
    }
    return inv?.kind;
  }

  /** A service binding whose every method call is one subrequest. */
  service(binding) {
    const als = this.als;
    return new Proxy(binding, {
      get(target, prop, receiver) {
        const value = Reflect.get(target, prop, receiver);
        if (typeof value !== 'function' || prop === 'constructor') return value;
        return function counted(...args) {
          try {
            als.getStore()?.admit('service');
          } catch (e) {
            return Promise.reject(e);
          }
          return value.apply(target, args);
        };
      },
    });
  }

  /** globalThis.fetch counts one subrequest per call made inside an invocation. */
  installFetch() {
    const original = globalThis.fetch;
    if (typeof original !== 'function' || original.d1queueCounted) return;
    const als = this.als;
    const counted = function fetch(...args) {
      try {
        als.getStore()?.admit('fetch');
      } catch (e) {
        return Promise.reject(e);
      }
      return als.run(undefined, () => original.apply(this, args)); // not exit(): see d1()
    };
    counted.d1queueCounted = true;
    globalThis.fetch = counted;
  }

  /** Pyodide's stdout: the drain's report lines wait for their invocation's end. */
  stdout(line) {
    const inv = this.current();
    if (this.enabled && inv && !inv.ended && line.includes('"d1queue.drain"')) {
      try {
        const report = JSON.parse(line);
        if (report?.event === 'd1queue.drain') {
          inv.held.push(report);
          return;
        }
      } catch {}
    }
    this.out(line + '\n');
  }
}

class Invocation {
  constructor(limits, kind, ctx) {
    this.limits = limits;
    this.kind = kind;
    this.ctx = ctx;
    if (ctx) ctx.invocation = this;
    this.workerCpu = 0; // ms spent running the Worker's own code (timed())
    this.stepStart = null; // cpuNow() when the step running now began
    this.offStep = []; // host work a step handed over, run when it ends (uncharged)
    this.startWall = Date.now();
    this.startMain = mainNow();
    this.startProcess = processNow();
    this.subrequests = 0;
    this.d1Queries = 0;
    this.dataPoints = 0; // Analytics Engine points written (not subrequests)
    this.refused = 0;
    this.outcome = 'ok';
    this.cpuWarned = false;
    this.cutReason = null; // set when its time is up: later I/O fails
    this.cancelled = 0; // waitUntil tasks still running when cut
    this.cutPromise = new Promise((resolve) => { this.onCut = resolve; });
    this.held = [];
    this.ended = false;
    this.faults = null; // D1 faults injected into its calls, by kind (faults.mjs)
    // A scheduled run's or a queue consumer's wall time counts from its start
    // (15 min each: Workers and Queues limits); other invocations' waitUntil
    // window opens at the response (responded()).
    this.deadline = kind === 'scheduled' || kind === 'queue' ? this.startWall + limits.scheduledMs : null;
  }

  /** CPU the Worker itself has used: its Python steps and the JS they call
   * synchronously (the SDK, the D1 binding's prepare and bind and its
   * request's JSON), and the parsing of D1's answers (charge()), as workerd
   * counts an isolate's execution; not the host's Node I/O (HTTP serving,
   * the D1 relay's transport, outbound fetch), which workerd does off the
   * isolate. */
  cpuMs() {
    return this.workerCpu + (this.stepStart === null ? 0 : cpuNow() - this.stepStart);
  }

  /** End the step running now: charge its CPU, then run the host work it
   * handed over (offStep), uncharged. */
  closeStep() {
    this.workerCpu += cpuNow() - this.stepStart;
    this.stepStart = null;
    if (this.offStep.length) {
      const work = this.offStep;
      this.offStep = [];
      for (const fn of work) fn();
    }
  }

  /** Run `fn`, which resolves a promise the Worker awaits (a D1 answer), as
   * Worker CPU outside any step: it and the promise reactions it sets off
   * (Pyodide passing the value into Python), which run before a microtask
   * queued after them, where the clock stops. Inside a step it is charged
   * already. */
  charge(fn) {
    if (this.stepStart !== null) return fn();
    this.stepStart = cpuNow();
    try {
      fn();
    } finally {
      queueMicrotask(() => this.closeStep());
    }
  }

  /** Run fn inside this invocation (a scheduled run is also cut at its wall-time deadline). */
  async run(fn) {
    const work = this.limits.als.run(this, fn);
    try {
      if (!this.limits.enabled || this.deadline === null) return await work;
      let timer;
      const late = new Promise((resolve) => {
        timer = setTimeout(resolve, Math.max(0, this.deadline - Date.now()), LATE);
        timer.unref?.();
      });
      this.afterCut(work);
      const result = await Promise.race([work, late]).finally(() => clearTimeout(timer));
      if (result !== LATE) return result;
      if (!this.cutReason) this.cut('exceededWallTime', 1);
      return undefined;
    } catch (e) {
      if (this.outcome === 'ok') this.outcome = 'exception';
      throw e;
    } finally {
      this.overCpu(); // also fails an invocation that did no I/O after its CPU ran out
    }
  }

  /** True when this invocation has used more CPU than its plan allows (and says so once). */
  overCpu() {
    const limits = this.limits;
    if (!limits.enabled || this.outcome === 'exceededCpu') return this.outcome === 'exceededCpu';
    const used = this.cpuMs();
    if (used <= limits.caps.cpuMs) return false;
    if (limits.enforceCpu) {
      this.outcome = 'exceededCpu';
      return true;
    }
    if (!this.cpuWarned) {
      this.cpuWarned = true;
      limits.err(`d1queue host: warning: a ${this.kind} invocation used ${used.toFixed(1)} ms of CPU, over the ${limits.plan} plan's ${limits.caps.cpuMs} ms (--cpu warn: not enforced)\n`);
    }
    return false;
  }

  /** One subrequest of `type` ('d1', 'fetch', 'service'), or the error Cloudflare would throw. */
  admit(type) {
    const limits = this.limits;
    if (!limits.enabled) return;
    if (this.cutReason) {
      this.refused++;
      throw new Error(`d1queue host: this ${this.kind} invocation is over (${this.cutReason}); its waitUntil work was cancelled and can do no more I/O`);
    }
    if (this.overCpu()) {
      this.refused++;
      throw cpuError();
    }
    const caps = limits.caps;
    if (this.subrequests >= caps.subrequests || (type === 'd1' && this.d1Queries >= caps.d1Queries)) {
      this.refused++;
      throw new Error(type === 'd1' ? TOO_MANY_API_REQUESTS : TOO_MANY_SUBREQUESTS);
    }
    this.subrequests++;
    if (type === 'd1') this.d1Queries++;
  }

  /** The response went out: the waitUntil window opens (not for scheduled runs). */
  responded() {
    if (this.deadline === null) this.deadline = Date.now() + this.limits.waitUntilMs;
  }

  /** Mark the invocation cut: its remaining work can do no more I/O. */
  cut(reason, tasks) {
    this.cutReason = reason;
    this.cancelled = tasks;
    if (reason === 'exceededWallTime' && this.outcome === 'ok') this.outcome = 'exceededWallTime';
    this.limits.err(`d1queue host: ${WAIT_UNTIL_CANCELLED}\n`);
    this.onCut();
  }

  /**
   * A waitUntil promise as the host tracks it: settled by the work or by the
   * cut, whichever comes first. Cut work goes on in Pyodide (it cannot be
   * stopped from here), but its I/O fails, and that failure is logged.
   */
  bound(promise) {
    if (!this.limits.enabled) return promise;
    const work = Promise.resolve(promise);
    this.afterCut(work);
    return Promise.race([work, this.cutPromise]);
  }

  /** Work that fails after the cut (its I/O is refused) says so on stderr. */
  afterCut(work) {
    Promise.resolve(work).catch((e) => {
      if (!this.cutReason) return; // failed before the cut: its caller reports it
      const text = e?.name === 'PythonError' ? e.message.trimEnd() : String(e?.message ?? e);
      this.limits.err(`d1queue host: cancelled waitUntil work of a ${this.kind} invocation failed: ${text}\n`);
    });
  }

  /**
   * Wait for the waitUntil work (`own`, a set of promises that leave it when
   * they settle) until the deadline; true if it was cut there.
   */
  async settle(own) {
    const all = async () => { while (own.size) await Promise.allSettled([...own]); };
    const hadWork = own.size > 0;
    if (!this.limits.enabled) {
      await all();
      return false;
    }
    this.responded();
    let timer;
    const late = new Promise((resolve) => {
      timer = setTimeout(resolve, Math.max(0, this.deadline - Date.now()), LATE);
      timer.unref?.();
    });
    const how = await Promise.race([all(), late]).finally(() => clearTimeout(timer));
    if (how === LATE && own.size) {
      this.cut(this.kind === 'scheduled' || this.kind === 'queue' ? 'exceededWallTime' : 'waitUntil window closed', own.size);
      return true;
    }
    if (hadWork) this.overCpu(); // waitUntil work past the CPU limit fails the invocation too
    return false;
  }

  /** Print the held drain lines and the invocation's own line. */
  end() {
    if (this.ended) return;
    this.ended = true;
    const limits = this.limits;
    if (!limits.enabled) return;
    const cpu = Math.round(this.cpuMs() * 100) / 100;
    for (const report of this.held) {
      limits.out(JSON.stringify({ ...report, cpu_ms: cpu, host_subrequests: this.subrequests, host_d1_queries: this.d1Queries }) + '\n');
    }
    const line = {
      event: 'd1queue.invocation',
      kind: this.kind,
      plan: limits.plan,
      cpu_ms: cpu,
      main_thread_cpu_ms: Math.round((mainNow() - this.startMain) * 100) / 100,
      process_cpu_ms: Math.round((processNow() - this.startProcess) * 100) / 100,
      wall_ms: Date.now() - this.startWall,
      subrequests: this.subrequests,
      d1_queries: this.d1Queries,
      outcome: this.outcome,
    };
    if (this.refused) line.refused = this.refused;
    if (this.dataPoints) line.data_points = this.dataPoints;
    if (this.cpuWarned || (this.outcome !== 'exceededCpu' && cpu > limits.caps.cpuMs)) line.cpu_over_limit = true;
    if (this.cancelled) line.wait_until_cancelled = this.cancelled;
    if (this.faults) line.d1_faults = this.faults;
    limits.out(JSON.stringify(line) + '\n');
  }
}
