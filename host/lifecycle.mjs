// How the host reports its errors, and how it ends: what it releases on every
// way out (Miniflare, which runs workerd, and with --fresh the temporary D1
// state folder) and what a signal does.
//
// Only node: built-ins, so host.mjs can load it before checking Node's version.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// Node prints the source line of an uncaught error; for Pyodide that is its
// whole 1 MB minified module. Print the error itself instead.
// A Python exception's message is its traceback; its JS stack is wasm noise.
export const oneError = (e) => (e?.name === 'PythonError' ? e.message.trimEnd() : (e && e.stack) || String(e));

/** One `d1queue host: …` line on stderr. */
export function warn(message) {
  process.stderr.write(`d1queue host: ${message}\n`);
}

/** Stop before anything needs releasing (bad options, an old Node). */
export function die(reason) {
  warn(reason);
  process.exit(1);
}

export class Lifecycle {
  constructor() {
    this.mf = null; // Miniflare (D1, Queues and the relay Worker), disposed on every exit path
    this.stateDir = null; // where D1 keeps its state
    this.temporary = false; // --fresh: stateDir is removed at exit
  }

  /** Where D1 lives, with wrangler's layout: --persist-to DIR keeps D1 in
   * DIR/v3/d1; the default is .wrangler/state next to wrangler.toml (what
   * plain `--local` uses); --fresh, a new temporary folder. */
  useStateDir(settings) {
    this.temporary = settings.fresh;
    this.stateDir = settings.fresh
      ? fs.mkdtempSync(path.join(os.tmpdir(), 'd1queue-host-'))
      : settings.persistTo ?? path.join(settings.root, '.wrangler', 'state');
    return this.stateDir;
  }

  async cleanup() {
    try { await this.mf?.dispose(); } catch (e) { warn(`dispose: ${e.message}`); }
    this.mf = null;
    if (this.temporary && this.stateDir) fs.rmSync(this.stateDir, { recursive: true, force: true });
  }

  /** SIGINT / SIGTERM call `stop(signal)` once; a second signal exits at once. */
  onSignals(stop) {
    // Miniflare's exit-hook already listens and would process.exit(128+n) at once,
    // before waitUntil work settles; its 'exit' hook (which stops workerd) stays.
    process.removeAllListeners('SIGINT');
    process.removeAllListeners('SIGTERM');
    let stopping = false;
    const on = (signal) => {
      if (stopping) return process.exit(1); // second signal: stop now
      stopping = true;
      return stop(signal);
    };
    process.on('SIGINT', () => on('SIGINT'));
    process.on('SIGTERM', () => on('SIGTERM'));
  }

  /** Stop once started: release what is held, exit 1. Never returns. */
  async fail(reason) {
    warn(reason);
    await this.cleanup();
    process.exit(1);
  }
}
