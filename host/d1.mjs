// A production-shaped D1 binding over Miniflare's D1.
//
// getPlatformProxy() hands Node a *proxy* of the D1 binding living in workerd:
// its `constructor.name` is "constructor" (so the workers SDK would not wrap
// it), and its arguments cross into workerd through devalue, so a Python list
// handed to batch() fails with "DevalueError: Cannot stringify arbitrary
// non-POJOs" where the real binding would not. These classes carry the real
// names (the SDK wraps a binding only when `constructor.name` is "D1Database")
// and mirror workerd's src/cloudflare/internal/d1-api.ts on the JS side:
// bind() validates/coerces values the same way (so Python `None`, which
// arrives as `undefined`, fails with the same D1_TYPE_ERROR), and batch()
// calls `statements.map(...)` as workerd does, which a Pyodide list proxy
// supports. The SQL itself runs in Miniflare's (workerd's) real D1.

const inner = Symbol('miniflare');

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
  constructor(stmt) { this[inner] = stmt; }
  bind(...values) { return new D1PreparedStatement(this[inner].bind(...values.map(coerce))); }
  first(colName) { return colName === undefined ? this[inner].first() : this[inner].first(colName); }
  all() { return this[inner].all(); }
  run() { return this[inner].run(); }
  raw(options) { return options === undefined ? this[inner].raw() : this[inner].raw(options); }
}

export class D1DatabaseSession {
  constructor(session) { this[inner] = session; }
  prepare(query) { return new D1PreparedStatement(this[inner].prepare(query)); }
  batch(statements) { return this[inner].batch(unwrapStatements(statements)); }
  getBookmark() { return this[inner].getBookmark(); }
}

export class D1Database {
  constructor(db) { this[inner] = db; }
  prepare(query) { return new D1PreparedStatement(this[inner].prepare(query)); }
  batch(statements) { return this[inner].batch(unwrapStatements(statements)); }
  exec(query) { return this[inner].exec(query); }
  dump() { return this[inner].dump(); }
  withSession(constraintOrBookmark) { return new D1DatabaseSession(this[inner].withSession(constraintOrBookmark)); }
}

// --raw-db: the same binding under another constructor name, so the SDK's
// _EnvWrapper leaves it alone and Python sees the bare JsProxy.
export class RawD1Database extends D1Database {}
