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
// - CPU: free 10 ms, paid 30 s, measured as the process's CPU
//   (process.cpuUsage: see cpuNow) while the Worker's own code runs: the call that
//   starts a handler and every step of Pyodide's event loop (host.mjs routes
//   its scheduleCallback through timed()), charged to the invocation the
//   step belongs to, waitUntil work included. Node's I/O around it (HTTP
//   serving, outbound fetch, the D1 relay's replies) is not counted, as
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

export const TOO_MANY_SUBREQUESTS = 'Too many subrequests by single Worker invocation.';
export const TOO_MANY_API_REQUESTS = 'Too many API requests by single worker invocation.';
export const CPU_EXCEEDED = 'Worker exceeded CPU time limit.'; // error 1102
const PYTHON_CPU_EXCEEDED = 'Python Worker exceeded CPU time limit';
const WAIT_UNTIL_CANCELLED =
  'waitUntil() tasks did not complete within the allowed time after invocation end and have been cancelled. ' +
  'See: https://developers.cloudflare.com/workers/runtime-apis/context/#waituntil';

const LATE = Symbol('late');

// The clock every step of the Worker is timed with: the process's CPU
// (getrusage RUSAGE_SELF), which Linux reports to the microsecond. The main
// thread's own (process.threadCpuUsage, RUSAGE_THREAD) moves in scheduler
// ticks on these machines (4 ms steps, checked on kernel 6.18): a step of
// 30 us read 0 or 4,000 us, so an invocation's figure was a tally of which
// steps a tick happened to land in. The process clock also counts the host's
// other threads while a step runs (the relay's client thread, V8's GC
// helpers): a small overcount, never an undercount.
const cpuNow = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000; // ms
};
const processNow = cpuNow;

// The main thread's CPU to the nanosecond, for the invocation line's
// cross-check (read twice per invocation: a read costs ~13 us): the
// scheduler's own sum in /proc/thread-self/sched where Linux has it,
// else the tick-granular thread clock.
const mainNow = (() => {
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
      `${c.cpuMs} ms CPU${this.enforceCpu ? '' : ' (warn only)'}, waitUntil ${this.waitUntilMs / 1000} s, ` +
      `scheduled ${this.scheduledMs / 1000} s`;
  }

  /** The invocation the running code belongs to, if any. */
  current() {
    return this.als.getStore();
  }

  /** Run `fn` (one step of the Worker's code: an event-loop callback of
   * Pyodide's, or the call that starts a handler) and charge its CPU to the
   * current invocation. */
  timed(fn) {
    const inv = this.current();
    if (!inv || inv.stepStart !== null) return fn(); // no invocation, or nested
    inv.stepStart = cpuNow();
    try {
      return fn();
    } finally {
      inv.workerCpu += cpuNow() - inv.stepStart;
      inv.stepStart = null;
    }
  }

  /** A new invocation of `kind` ('fetch', 'scheduled', 'queue', 'rpc', 'test') for `ctx`. */
  begin(kind, ctx) {
    return new Invocation(this, kind, ctx);
  }

  /**
   * Wrap a D1 round trip `call(op, stmts, arg)` (d1.mjs): one subrequest and
   * one D1 query; `faults` (faults.mjs), if given, may delay or fail it.
   */
  d1(call, faults = null) {
    const als = this.als;
    return async (op, stmts, arg) => {
      const inv = als.getStore();
      inv?.admit('d1');
      // The relay's own I/O belongs to no invocation. run(undefined), not
      // exit(): exit() switches Node's async hooks off and on again, which
      // cost ~1.5 ms of main-thread CPU per D1 call here (V8 drops the code
      // it optimised for promises each time), charged to the Worker.
      return als.run(undefined, () => (faults ? faults.run(inv, () => call(op, stmts, arg)) : call(op, stmts, arg)));
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
    this.startWall = Date.now();
    this.startMain = mainNow();
    this.startProcess = processNow();
    this.subrequests = 0;
    this.d1Queries = 0;
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
   * synchronously (the SDK, the D1 binding's prepare and bind), as workerd
   * counts an isolate's execution; not the host's Node I/O (HTTP serving,
   * the D1 relay's replies, outbound fetch), which workerd does off the
   * isolate. */
  cpuMs() {
    return this.workerCpu + (this.stepStart === null ? 0 : cpuNow() - this.stepStart);
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
    if (this.cpuWarned || (this.outcome !== 'exceededCpu' && cpu > limits.caps.cpuMs)) line.cpu_over_limit = true;
    if (this.cancelled) line.wait_until_cancelled = this.cancelled;
    if (this.faults) line.d1_faults = this.faults;
    limits.out(JSON.stringify(line) + '\n');
  }
}
