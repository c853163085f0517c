// A production-shaped D1 binding over Miniflare's D1.
//
// These classes carry the real names (the workers SDK wraps a binding only
// when its `constructor.name` is "D1Database") and mirror workerd's
// src/cloudflare/internal/d1-api.ts on the JS side: bind() validates and
// coerces values the same way (so Python `None`, which arrives as
// `undefined`, fails with the same D1_TYPE_ERROR), and batch() calls
// `statements.map(...)` as workerd does, which a Pyodide list proxy supports.
// prepare() and bind() stay in Node, as they do in workerd; each query or
// batch is one round trip to Miniflare's real D1 (relay.mjs).

const inner = Symbol('statement');

// workerd d1-api.ts D1PreparedStatement.bind(): same accepted types, same error.
function coerce(value) {
  const type = typeof value;
  if (type === 'number' || type === 'string') return value;
  if (type === 'boolean') return value ? 1 : 0;
  if (type === 'object') {
    if (value == null) return value;
    if (Array.isArray(value) && value.every((b) => typeof b === 'number' && b >= 0 && b < 256)) return value;
    if (value instanceof ArrayBuffer) return Array.from(new Uint8Array(value));
    if (ArrayBuffer.isView(value)) return Array.from(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
  }
  let shown;
  try { shown = String(value); } catch { shown = Object.prototype.toString.call(value); }
  throw new Error(`D1_TYPE_ERROR: Type '${type}' not supported for value '${shown}'`, {
    cause: new Error(`Type '${type}' not supported for value '${shown}'`),
  });
}

// workerd d1-api.ts _send(): the request's body is the statements' JSON,
// made in the isolate (so charged to the Worker); the relay wraps it.
function send(call, op, stmts, arg) {
  return call(op, JSON.stringify(stmts), arg);
}

function unwrapStatements(statements) {
  // `.map` exists on JS arrays and on Pyodide proxies of Python lists alike.
  return statements.map((s) => {
    if (!(s instanceof D1PreparedStatement)) {
      throw new TypeError('D1_ERROR: batch() takes a list of D1PreparedStatement');
    }
    return s[inner];
  });
}

export class D1PreparedStatement {
  constructor(call, sql, params = []) { this.call = call; this[inner] = { sql, params }; }
  bind(...values) { return new D1PreparedStatement(this.call, this[inner].sql, values.map(coerce)); }
  first(colName) { return send(this.call, 'first', [this[inner]], colName ?? null); }
  all() { return send(this.call, 'all', [this[inner]]); }
  run() { return send(this.call, 'run', [this[inner]]); }
  raw(options) { return send(this.call, 'raw', [this[inner]], options ?? null); }
}

export class D1Database {
  /** `call(op, body, arg)`: one round trip to Miniflare (relay.mjs, through
   * limits.mjs), `body` the statements' JSON; it resolves to the result. */
  constructor(call) { this.call = call; }
  prepare(query) { return new D1PreparedStatement(this.call, query); }
  batch(statements) {
    let stmts;
    try {
      stmts = unwrapStatements(statements);
    } catch (e) {
      return Promise.reject(e);
    }
    return send(this.call, 'batch', stmts);
  }
  exec(query) { return send(this.call, 'exec', [{ sql: query, params: [] }]); }
}

// --raw-db: the same binding under another constructor name, so the SDK's
// _EnvWrapper leaves it alone and Python sees the bare JsProxy.
export class RawD1Database extends D1Database {}
