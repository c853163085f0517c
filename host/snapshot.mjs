// Memory snapshots of the Worker's Pyodide, so that a start with an upload
// already seen restores the Worker instead of booting Pyodide and importing it.
//
// Cloudflare imports a Python Worker once, at deploy, and snapshots its
// Pyodide's memory: every isolate starts from that snapshot. The host does
// the same on this machine. A cold start loads Pyodide and imports the
// Worker with randomness refused (pyhost.py), then writes Pyodide's memory to
// --root's .wrangler/snapshots/<key>.bin; a later start with the same key
// restores it (boot.mjs). An upload that uses randomness at import never
// loads, so never gets a snapshot: the rule is checked on every cold start,
// and a warm start restores what passed it.
//
// The key is a SHA-256 of everything the snapshot's Python state comes from:
// every file of the upload the Worker sees (worker.mjs treeFiles: wrangler's
// README.md, __pycache__ and dot-names left out) and of each --site folder,
// the main module, the compatibility flags workerd turns on, the Pyodide
// release, the Node release (globals are found again by name) and the host's
// own files that shape the state (pyhost.py, worker.mjs, this file). The env
// is not in it: the names the Worker read from its env while it was imported
// are recorded (EnvView), and a snapshot is used only if their values are
// still the same.
//
// What a snapshot cannot hold is JS: Pyodide keeps the JS objects Python
// refers to in a table outside its memory. Each is named when the snapshot is
// taken, by where it is found: a path from globalThis (the `js` module's
// globals) or from the host's JS modules (worker.mjs workerModules), and
// looked up there again by the host that restores it. A Worker that keeps any
// other JS object from its import gets no snapshot (the host says why) and
// starts cold each time. Also outside Pyodide's memory, and so set up again
// after a restore (worker.mjs, pyhost.resume): its file system, the working
// directory, and `random`'s seed. JS timers the import scheduled never fire in
// a restored host, as in workerd; Python's hash seed is the snapshot's.
//
// The cache keeps the newest KEEP snapshots (a use counts as new). A file is
// written beside its name and renamed into place, so hosts starting together
// never read half of one; each is checked whole (length, SHA-256) before use,
// and one that is not whole, or that Pyodide refuses, is deleted and the host
// boots cold, with a warning. `--no-snapshot` neither reads nor writes one;
// `rm -r .wrangler/snapshots` clears the cache.

import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { PYHOST, UPLOAD_SKIP, treeFiles } from './worker.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Bumped when what a snapshot holds, or how it is named, changes. */
export const FORMAT = 1;
/** Snapshots kept per cache folder (each about 40 MB). */
export const KEEP = 4;
const MAGIC = 'd1qsnap\n';
// The host's files whose code shapes the Python state a snapshot holds.
const HOST_FILES = [PYHOST, path.join(HERE, 'worker.mjs'), fileURLToPath(import.meta.url)];

const sha256 = (data) => crypto.createHash('sha256').update(data).digest('hex');

function sortedKeys(obj) {
  return Object.fromEntries(Object.keys(obj).sort().map((k) => [k, obj[k]]));
}

/** The cache key of the Worker's state after its import (see above). */
export function snapshotKey({ bundleDir, sites, mainModule, compatFlags, pyodideVersion }) {
  const hash = crypto.createHash('sha256');
  const part = (label, data) => {
    hash.update(`${label}\0${Buffer.byteLength(data)}\0`);
    hash.update(data);
  };
  part('format', String(FORMAT));
  part('pyodide', pyodideVersion);
  part('node', process.version);
  part('main', mainModule);
  part('flags', JSON.stringify(sortedKeys(compatFlags)));
  for (const file of HOST_FILES) part(`host:${path.basename(file)}`, fs.readFileSync(file));
  for (const [name, file] of treeFiles(bundleDir, UPLOAD_SKIP)) part(`upload:${name}`, fs.readFileSync(file));
  sites.forEach((dir, i) => {
    for (const [name, file] of treeFiles(dir)) part(`site${i}:${name}`, fs.readFileSync(file));
  });
  return hash.digest('hex');
}

// ------------------------------------------------------------------ env --

/** How a value of the env counts for a snapshot: a var by its value, a
 * binding by its kind (the restoring host hands Python its own). */
function describe(value) {
  if (value === undefined) return 'absent';
  if (value === null || ['string', 'number', 'boolean'].includes(typeof value)) return `value:${JSON.stringify(value)}`;
  return `${typeof value}:${value.constructor?.name ?? ''}`;
}

/**
 * The Worker's env as Python sees it through `cloudflare:workers` (`from
 * workers import env`): the same object, watched while the Worker is
 * imported, since a value read then is kept in the snapshot's memory.
 * `proxy` is what Python gets; the bindings may be added to `env` later.
 */
export class EnvView {
  constructor(env) {
    this.env = env;
    this.read = null; // the names read while recording; '*' if it was enumerated
    const note = (key) => {
      if (this.read && typeof key === 'string') this.read.add(key);
    };
    this.proxy = new Proxy(env, {
      get: (target, key, receiver) => { note(key); return Reflect.get(target, key, receiver); },
      has: (target, key) => { note(key); return Reflect.has(target, key); },
      getOwnPropertyDescriptor: (target, key) => { note(key); return Reflect.getOwnPropertyDescriptor(target, key); },
      ownKeys: (target) => { note('*'); return Reflect.ownKeys(target); },
    });
  }

  /** Runs `fn`, recording what it reads of the env; returns fn's result. */
  recording(fn) {
    this.read = new Set();
    try {
      return fn();
    } finally {
      this.names = [...this.read];
      this.read = null;
    }
  }

  /** {name: a hash of how it counts} for `names` ('*': every name the env has). */
  fingerprint(names) {
    const all = names.includes('*') ? [...new Set([...names, ...Object.keys(this.env)])] : names;
    return Object.fromEntries(all.filter((n) => n !== '*').sort().map((n) => [n, sha256(describe(this.env[n])).slice(0, 16)]));
  }
}

// ------------------------------------------- JS references, named --

function isObject(value) {
  return (typeof value === 'object' && value !== null) || typeof value === 'function';
}

/** Where each JS object Python refers to is found: {module, path} in the
 * host's modules (up to 3 properties deep: env's bindings are), or {path}
 * from globalThis (its own properties and theirs). */
class Names {
  constructor(modules) {
    this.found = new Map();
    const walk = (value, ref, depth) => {
      if (!isObject(value) || this.found.has(value)) return;
      this.found.set(value, ref);
      if (depth === 3) return;
      for (const [k, v] of Object.entries(value)) walk(v, { module: ref.module, path: [...ref.path, k] }, depth + 1);
    };
    for (const [name, module] of Object.entries(modules)) walk(module, { module: name, path: [] }, 0);
    this.globals = null;
  }

  #indexGlobals() {
    this.globals = new Map([[globalThis, { path: [] }]]);
    for (const name of Object.getOwnPropertyNames(globalThis)) {
      let value;
      try { value = globalThis[name]; } catch { continue; }
      if (!isObject(value)) continue;
      if (!this.globals.has(value)) this.globals.set(value, { path: [name] });
      for (const [key, d] of Object.entries(Object.getOwnPropertyDescriptors(value))) {
        if ('value' in d && isObject(d.value) && !this.globals.has(d.value)) this.globals.set(d.value, { path: [name, key] });
      }
    }
  }

  of(obj) {
    const ref = this.found.get(obj);
    if (ref) return ref;
    if (!this.globals) this.#indexGlobals();
    return this.globals.get(obj) ?? null;
  }
}

function resolve(ref, modules) {
  let value = 'module' in ref ? modules[ref.module] : globalThis;
  for (const key of ref.path) value = value?.[key];
  if (!isObject(value)) throw new Error(`the snapshot refers to ${'module' in ref ? ref.module : 'globalThis'}.${ref.path.join('.')}, which this host does not have`);
  return value;
}

function what(obj) {
  let name = typeof obj;
  let keys = '';
  try {
    name = obj.constructor?.name ?? name;
    keys = Object.keys(obj).slice(0, 6).join(', ');
  } catch {} // a revoked proxy, say: its type is all there is to say
  return `a JS ${name}${keys ? ` {${keys}}` : ''}`;
}

// ------------------------------------------------- take / restore --

/**
 * Pyodide's memory now, with the JS references Python holds named
 * (`modules`: worker.mjs workerModules). Throws, saying why, when there is
 * something a restored host could not have: a JS object found nowhere, or a
 * file the Worker keeps open.
 */
export function takeSnapshot(pyodide, modules) {
  const open = pyodide.FS.streams.flatMap((s, fd) => (s && fd > 2 ? [s.path] : []));
  if (open.length) throw new Error(`the Worker's import left files open (${open.join(', ')}), which a restored host would not have`);
  pyodide.pyimport('_d1queue_host').before_snapshot();
  const names = new Names(modules);
  const refs = [];
  const serializer = (obj) => {
    const ref = names.of(obj);
    if (!ref) throw new Error(`Python keeps ${what(obj)} from the Worker's import, which the host cannot find again after a restore`);
    refs.push(ref);
    return ref;
  };
  // Pyodide takes a snapshot only of an instance loaded with _makeSnapshot,
  // which also wraps the `js` module's globals in path-recording proxies for
  // the process's whole life: Python would then get proxies instead of the
  // real globals (`js.Response.new(...)` makes a Response whose prototype is a
  // proxy). The host names the globals itself instead (Names) and asks for
  // the snapshot only now.
  const api = pyodide._api;
  const was = api.config._makeSnapshot;
  api.config._makeSnapshot = true;
  try {
    const bytes = api.makeSnapshot(serializer);
    // A restore that finds the env's bindings must wait for them (boot.mjs).
    const envDeep = refs.some((r) => r.module === '_pyodide_entrypoint_helper' && r.path[0] === 'cloudflareWorkersModule' && r.path[1] === 'env' && r.path.length > 2);
    return { bytes, envDeep };
  } finally {
    api.config._makeSnapshot = was;
  }
}

/**
 * Pyodide restored from `bytes` (Snapshot.bytes), its JS references given
 * back from `modules`; `options` as for loadPyodide. Rejects if Pyodide
 * refuses the snapshot.
 */
export async function restorePyodide(loadPyodide, bytes, modules, options) {
  // Pyodide's own module factory, beside the pyodide.mjs `pyodide` resolves to.
  const { default: createPyodideModule } = await import(new URL('pyodide.asm.mjs', import.meta.resolve('pyodide')).href);
  // Pyodide's snapshot header: [magic, offset of the memory image, ...].
  const memoryBytes = bytes.byteLength - new Uint32Array(bytes.buffer, bytes.byteOffset, 4)[1];
  return loadPyodide({
    ...options,
    _loadSnapshot: bytes,
    _snapshotDeserializer: (ref) => resolve(ref, modules),
    // Pyodide copies the image into its wasm memory as it is at start-up
    // (30 MB), which is smaller than a Worker's image: grown first.
    createPyodideModule: async (settings) => {
      const module = await createPyodideModule(settings);
      if (!module.growMemory(memoryBytes) && module.HEAP8.length < memoryBytes) throw new Error(`cannot grow Pyodide's memory to ${memoryBytes} bytes`);
      return module;
    },
  });
}

// ---------------------------------------------------------------- cache --

/** A snapshot read back: `meta` (its header) and `bytes` (Pyodide's). */
export class SnapshotCache {
  constructor(dir, keep = KEEP) {
    this.dir = dir;
    this.keep = keep;
  }

  file(key) {
    return path.join(this.dir, `${key}.bin`);
  }

  /** True if the folder holds no snapshot at all. */
  empty() {
    try {
      return !fs.readdirSync(this.dir).some((f) => f.endsWith('.bin'));
    } catch {
      return true;
    }
  }

  /** The snapshot stored under `key`, checked whole, as {meta, bytes}; null
   * if there is none. Throws if the one there is not whole. */
  read(key) {
    const file = this.file(key);
    let data;
    try {
      data = fs.readFileSync(file);
    } catch (e) {
      if (e.code === 'ENOENT') return null;
      throw e;
    }
    if (data.subarray(0, MAGIC.length).toString('latin1') !== MAGIC) throw new Error('not a snapshot file');
    const headerBytes = data.readUInt32LE(MAGIC.length);
    const start = MAGIC.length + 4;
    const meta = JSON.parse(data.subarray(start, start + headerBytes).toString('utf8'));
    const offset = meta.offset;
    if (meta.format !== FORMAT || meta.key !== key) throw new Error(`written for another key or format (${meta.format})`);
    if (data.length !== offset + meta.bytes) throw new Error(`${data.length} bytes, not ${offset + meta.bytes}: cut short`);
    const bytes = new Uint8Array(data.buffer, data.byteOffset + offset, meta.bytes);
    if (sha256(bytes) !== meta.sha256) throw new Error('its checksum does not match');
    const now = new Date();
    try { fs.utimesSync(file, now, now); } catch {} // used: among the newest again
    return { meta, bytes };
  }

  /** Store `bytes` under `key` with `meta`; resolves once it is in place and
   * the oldest beyond `keep` are gone. */
  async write(key, meta, bytes) {
    await fs.promises.mkdir(this.dir, { recursive: true });
    const header = { format: FORMAT, key, ...meta, bytes: bytes.byteLength, sha256: sha256(bytes), offset: 0 };
    // Pyodide reads its header as 32-bit words: the image starts 16-aligned.
    const json = () => Buffer.from(JSON.stringify(header), 'utf8');
    header.offset = Math.ceil((MAGIC.length + 4 + json().length + 16) / 16) * 16;
    const head = Buffer.alloc(header.offset);
    head.write(MAGIC, 0, 'latin1');
    const text = json();
    head.writeUInt32LE(text.length, MAGIC.length);
    text.copy(head, MAGIC.length + 4);
    // Beside its name, then renamed: a host starting meanwhile reads the old
    // whole file or none, never a half-written one; the same key written by
    // two hosts at once ends as one of the two, whole.
    const tmp = `${this.file(key)}.${process.pid}.tmp`;
    try {
      const fd = await fs.promises.open(tmp, 'w');
      try {
        await fd.writev([head, bytes]);
      } finally {
        await fd.close();
      }
      await fs.promises.rename(tmp, this.file(key));
    } catch (e) {
      await fs.promises.rm(tmp, { force: true });
      throw e;
    }
    this.prune();
  }

  /** Delete the snapshot under `key` (it could not be used); one that cannot
   * be deleted (another user's file) is left, and fails again next time. */
  discard(key) {
    try { fs.rmSync(this.file(key), { force: true }); } catch {}
  }

  /** Keep the newest `keep` snapshots; drop temporary files a killed host left. */
  prune() {
    let entries;
    try {
      entries = fs.readdirSync(this.dir).map((name) => {
        try {
          return { name, mtime: fs.statSync(path.join(this.dir, name)).mtimeMs };
        } catch {
          return null; // removed meanwhile by another host
        }
      }).filter(Boolean);
    } catch {
      return;
    }
    const hour = Date.now() - 3600_000;
    const old = entries.filter((e) => e.name.endsWith('.tmp') && e.mtime < hour);
    const kept = entries.filter((e) => e.name.endsWith('.bin')).sort((a, b) => b.mtime - a.mtime);
    for (const e of [...old, ...kept.slice(this.keep)]) fs.rmSync(path.join(this.dir, e.name), { force: true });
  }
}
