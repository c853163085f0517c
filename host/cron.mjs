// Minute-level cron matching for `--crons` (UTC, as Cloudflare runs them),
// and the timer that runs the config's crons each minute.
// Five fields: minute hour day-of-month month day-of-week; each a list of
// `*`, `N`, `A-B`, with an optional `/STEP`; month and weekday names
// (JAN, MON…); weekday 7 is Sunday. As in standard cron, when both
// day-of-month and day-of-week are restricted, either may match.

const NAMES = {
  month: ['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'],
  dow: ['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'],
};
const FIELDS = [
  { min: 0, max: 59 },
  { min: 0, max: 23 },
  { min: 1, max: 31 },
  { min: 1, max: 12, names: NAMES.month, base: 1 },
  { min: 0, max: 7, names: NAMES.dow, base: 0 },
];

function value(text, field) {
  const i = field.names?.indexOf(text.toUpperCase()) ?? -1;
  const n = i >= 0 ? i + field.base : Number(text);
  if (!Number.isInteger(n) || n < field.min || n > field.max) throw new Error(`bad cron value '${text}'`);
  return n;
}

function parseField(text, field) {
  const set = new Set();
  for (const part of text.split(',')) {
    const [range, stepText] = part.split('/');
    const step = stepText === undefined ? 1 : Number(stepText);
    if (!Number.isInteger(step) || step < 1) throw new Error(`bad cron step '${part}'`);
    let lo, hi;
    if (range === '*') [lo, hi] = [field.min, field.max];
    else if (range.includes('-')) [lo, hi] = range.split('-').map((t) => value(t, field));
    else [lo, hi] = [value(range, field), stepText === undefined ? value(range, field) : field.max];
    for (let n = lo; n <= hi; n += step) set.add(n);
  }
  return { set, any: text === '*' };
}

export function parseCron(expr) {
  const parts = expr.trim().split(/\s+/);
  if (parts.length !== 5) throw new Error(`cron '${expr}' must have 5 fields`);
  const [minute, hour, dom, month, dow] = parts.map((p, i) => parseField(p, FIELDS[i]));
  if (dow.set.has(7)) dow.set.add(0);
  return (date) => {
    if (!minute.set.has(date.getUTCMinutes()) || !hour.set.has(date.getUTCHours())) return false;
    if (!month.set.has(date.getUTCMonth() + 1)) return false;
    const domOk = dom.set.has(date.getUTCDate());
    const dowOk = dow.set.has(date.getUTCDay());
    if (dom.any || dow.any) return domOk && dowOk;
    return domOk || dowOk;
  };
}

/** The config's cron expressions, each {expr, match} or {expr, error}. */
export function parseCrons(exprs) {
  return exprs.map((expr) => {
    try { return { expr, match: parseCron(expr) }; } catch (e) { return { expr, error: e.message }; }
  });
}

/** --crons: at the start of each minute (5 ms past it, so the minute has
 * turned on this clock), `run(expr, minuteMs)` for each cron that matches
 * it; an expression that does not parse is reported once and skipped.
 * Returns a function that stops the timer. */
export function startCrons(crons, run) {
  for (const c of crons) if (c.error) process.stderr.write(`d1queue host: ignoring cron '${c.expr}': ${c.error}\n`);
  let timer = null;
  const tick = () => {
    const now = new Date();
    const minute = new Date(Math.floor(now.getTime() / 60000) * 60000);
    for (const c of crons) {
      if (c.match?.(minute)) run(c.expr, minute.getTime());
    }
    timer = setTimeout(tick, 60000 - (Date.now() % 60000) + 5);
  };
  timer = setTimeout(tick, 60000 - (Date.now() % 60000) + 5);
  return () => clearTimeout(timer);
}
