// Workers Analytics Engine offline ([[analytics_engine_datasets]]): each
// binding's writeDataPoint checks the point as the platform's limits say and
// keeps it, with the time and the invocation that wrote it:
//   - in memory, for GET /__test/analytics (hooks.mjs);
//   - appended as one JSON line to <state>/analytics/<dataset>.jsonl, where a
//     developer can read what a deployment's dataset would hold.
// Limits (developers.cloudflare.com/analytics/analytics-engine/limits): at
// most 20 blobs (16 KB in all), 20 doubles and 1 index of at most 96 bytes a
// point, and 250 points an invocation (limits.mjs counts them). A point past
// any of them throws, so an upload that would lose points on Cloudflare fails
// loudly here. Writes are not subrequests and send nothing the Worker awaits.

import fs from 'node:fs';
import path from 'node:path';

export const MAX_BLOBS = 20;
export const MAX_BLOB_BYTES = 16 * 1024;
export const MAX_DOUBLES = 20;
export const MAX_INDEX_BYTES = 96;

const bytes = (v) => (v instanceof ArrayBuffer || ArrayBuffer.isView(v) ? v.byteLength : Buffer.byteLength(String(v ?? '')));

/** A point's fields as plain arrays, or the error the limits give. */
export function checkedPoint(point) {
  const list = (v, name) => {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) throw new TypeError(`writeDataPoint: ${name} must be an array`);
    return v;
  };
  const blobs = list(point?.blobs, 'blobs');
  const doubles = list(point?.doubles, 'doubles');
  const indexes = list(point?.indexes, 'indexes');
  if (blobs.length > MAX_BLOBS) throw new RangeError(`writeDataPoint: ${blobs.length} blobs, at most ${MAX_BLOBS}`);
  const size = blobs.reduce((n, b) => n + bytes(b), 0);
  if (size > MAX_BLOB_BYTES) throw new RangeError(`writeDataPoint: blobs of ${size} bytes, at most ${MAX_BLOB_BYTES}`);
  if (doubles.length > MAX_DOUBLES) throw new RangeError(`writeDataPoint: ${doubles.length} doubles, at most ${MAX_DOUBLES}`);
  if (!doubles.every((d) => typeof d === 'number')) throw new TypeError('writeDataPoint: doubles must be numbers');
  if (indexes.length > 1) throw new RangeError(`writeDataPoint: ${indexes.length} indexes, at most 1`);
  if (indexes.length && bytes(indexes[0]) > MAX_INDEX_BYTES) throw new RangeError(`writeDataPoint: an index of ${bytes(indexes[0])} bytes, at most ${MAX_INDEX_BYTES}`);
  return { blobs: blobs.map((b) => (b === null ? null : String(b))), doubles: [...doubles], indexes: indexes.map(String) };
}

/** Every dataset's points, kept for the test hook and the state folder. */
export class AnalyticsStore {
  constructor(stateDir) {
    this.dir = stateDir ? path.join(stateDir, 'analytics') : null;
    this.points = [];
  }

  keep(dataset, point, kind) {
    const kept = { dataset, timestamp: new Date().toISOString(), invocation: kind ?? null, ...point };
    this.points.push(kept);
    if (this.dir) {
      fs.mkdirSync(this.dir, { recursive: true });
      fs.appendFileSync(path.join(this.dir, `${dataset}.jsonl`), JSON.stringify(kept) + '\n');
    }
  }
}

/** One [[analytics_engine_datasets]] binding. `admit()` counts a point on
 * the current invocation (limits.mjs) and returns its kind. */
export class AnalyticsDataset {
  constructor(dataset, store, admit) {
    this.dataset = dataset;
    this.store = store;
    this.admit = admit;
  }

  writeDataPoint(point) {
    const checked = checkedPoint(point);
    const kind = this.admit();
    this.store.keep(this.dataset, checked, kind);
  }
}
