"""The dashboard's stylesheet and script, served by the Worker itself from
/ui/static/ (no build step, no CDN, nothing fetched from elsewhere).

They are Python strings rather than files so they travel in the upload as
any module does (wrangler uploads src/'s Python modules; other files would
need rules of their own). The Content-Security-Policy allows scripts and
styles from this origin only, so nothing here may be inlined into a page.
"""

from __future__ import annotations

import hashlib

CSS = """\
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #57606a; --bg: #fff;
  --panel: #f6f8fa; --line: #d0d7de; --accent: #0b57d0; --bad: #b42318; --ok: #1a7f37;
  --warn: #9a6700; --focus: #ff9800; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --muted: #9da7b3; --bg: #0d1117;
  --panel: #161b22; --line: #30363d; --accent: #6ea8fe; --bad: #ff7b72; --ok: #56d364;
  --warn: #e3b341; } }
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
a { color: var(--accent); }
:focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
.skip { position: absolute; left: -999px; top: 0; background: var(--bg); padding: .5rem; }
.skip:focus { left: .5rem; z-index: 10; }
header.top { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem 1.25rem;
  padding: .6rem 1rem; border-bottom: 1px solid var(--line); background: var(--panel); }
header.top .brand { font-weight: 700; text-decoration: none; color: var(--fg); }
header.top nav ul { display: flex; flex-wrap: wrap; gap: .25rem 1rem; list-style: none;
  margin: 0; padding: 0; }
header.top nav a[aria-current=page] { font-weight: 700; color: var(--fg); }
header.top .session { margin-left: auto; display: flex; gap: .75rem; align-items: center;
  flex-wrap: wrap; }
main { padding: 1rem; max-width: 78rem; margin: 0 auto; }
h1 { font-size: 1.4rem; margin: .2rem 0 .8rem; overflow-wrap: anywhere; }
h2 { font-size: 1.1rem; margin: 1.4rem 0 .6rem; }
.table-wrap { overflow-x: auto; border: 1px solid var(--line); border-radius: 6px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .45rem .6rem; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { background: var(--panel); font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:last-child td { border-bottom: 0; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: .9em; }
td.mono { overflow-wrap: anywhere; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
  padding: .75rem; overflow: auto; max-height: 30rem; white-space: pre-wrap;
  overflow-wrap: anywhere; }
button, .button { font: inherit; padding: .35rem .8rem; border-radius: 6px;
  border: 1px solid var(--line); background: var(--panel); color: var(--fg); cursor: pointer;
  text-decoration: none; display: inline-block; }
button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
button.danger { border-color: var(--bad); color: var(--bad); }
button:disabled { opacity: .55; cursor: not-allowed; }
form.inline { display: inline; margin: 0; }
.filters { display: flex; flex-wrap: wrap; gap: .6rem 1rem; align-items: end;
  margin: 0 0 1rem; padding: .75rem; background: var(--panel); border: 1px solid var(--line);
  border-radius: 6px; }
.filters label, .field label { display: block; font-size: .85rem; color: var(--muted); }
input[type=text], input[type=password], input[type=search], select { font: inherit;
  padding: .35rem .5rem; border: 1px solid var(--line); border-radius: 6px;
  background: var(--bg); color: var(--fg); min-width: 10rem; max-width: 100%; }
textarea { font: inherit; font-family: var(--mono, monospace); padding: .35rem .5rem;
  border: 1px solid var(--line); border-radius: 6px; background: var(--bg); color: var(--fg);
  width: 100%; max-width: 40rem; display: block; }
input[type=number] { font: inherit; padding: .35rem .5rem; border: 1px solid var(--line);
  border-radius: 6px; background: var(--bg); color: var(--fg); width: 9rem; max-width: 100%; }
.field { margin: 0 0 1rem; }
.limits-form { margin: 0 0 1rem; padding: .75rem; background: var(--panel);
  border: 1px solid var(--line); border-radius: 6px; }
.limits-form .fields { display: flex; flex-wrap: wrap; gap: .6rem 1rem; }
.limits-form label { display: block; font-size: .85rem; color: var(--muted); }
.table-wrap.narrow { max-width: 24rem; margin: 0 0 1rem; }
caption { text-align: left; padding: .45rem .6rem; font-weight: 600; }
.signin { max-width: 26rem; margin: 3rem auto; padding: 1.5rem; border: 1px solid var(--line);
  border-radius: 8px; background: var(--panel); }
.signin input { width: 100%; }
.notice, .error-box { padding: .6rem .8rem; border-radius: 6px; margin: 0 0 1rem;
  border: 1px solid var(--line); }
.notice { border-color: var(--ok); }
.error-box { border-color: var(--bad); color: var(--bad); }
.empty { padding: 1.2rem; border: 1px dashed var(--line); border-radius: 6px; color: var(--muted); }
.empty strong { color: var(--fg); }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 999px; font-size: .85em;
  border: 1px solid var(--line); white-space: nowrap; }
.badge.paused, .badge.failed { border-color: var(--bad); color: var(--bad); }
.badge.running, .badge.ready, .badge.completed, .badge.succeeded { border-color: var(--ok);
  color: var(--ok); }
.badge.delayed, .badge.reserved, .badge.waiting { border-color: var(--warn); color: var(--warn); }
.muted, time .rel, .rel { color: var(--muted); }
.stats { display: grid; grid-template-columns: repeat(auto-fit, minmax(8rem, 1fr)); gap: .6rem;
  margin: 0 0 1rem; padding: 0; list-style: none; }
.stats li { padding: .6rem .8rem; border: 1px solid var(--line); border-radius: 6px; }
.stats .n { display: block; font-size: 1.3rem; font-weight: 700; }
dl.props { display: grid; grid-template-columns: max-content 1fr; gap: .35rem 1rem; }
dl.props dt { color: var(--muted); }
dl.props dd { margin: 0; overflow-wrap: anywhere; }
.actions { display: flex; flex-wrap: wrap; gap: .5rem; margin: .75rem 0; align-items: center; }
.pager { display: flex; gap: 1rem; margin: .75rem 0; flex-wrap: wrap; }
ul.links { list-style: none; margin: 0; padding: 0; display: grid; gap: .25rem;
  grid-template-columns: repeat(auto-fill, minmax(min(22rem, 100%), 1fr)); }
ul.links li { overflow-wrap: anywhere; }
.progress { display: grid; gap: .35rem; max-width: 40rem; }
.progress p { margin: 0; }
td.result code { overflow-wrap: anywhere; }
h3 { font-size: 1rem; margin: 1rem 0 .4rem; }
.crumbs p { margin: 0 0 .2rem; color: var(--muted); overflow-wrap: anywhere; }
.chart { width: 100%; max-width: 60rem; height: auto; display: block; }
.chart text { fill: var(--fg); font: 11px system-ui, sans-serif; }
.chart .at, .chart .kl { font-size: 12px; }
.chart .axis, .chart .tick { stroke: var(--muted); stroke-width: 1; }
.chart .grid { stroke: var(--line); stroke-width: .5; stroke-dasharray: 2 3; }
.k-c { fill: var(--ok); } .k-r { fill: var(--warn); } .k-f { fill: var(--bad); }
.k-x { fill: var(--muted); } .k-p { fill: var(--panel); }
.mark { stroke: var(--bg); stroke-width: 1.3; } .mark-dot { fill: var(--bg); }
.chart .key, .share > rect, .swatch > rect { stroke: var(--fg); stroke-width: .4; }
.chart polyline { fill: none; stroke-width: 2; }
.chart .p50 { stroke: var(--accent); } .chart .p95 { stroke: var(--bad); stroke-dasharray: 6 3; }
.chart circle.pt.p50 { fill: var(--accent); stroke: none; }
.chart rect.pt.p95 { fill: var(--bad); stroke: none; }
.share { width: 100%; height: 1.1rem; display: block; border: 1px solid var(--line);
  border-radius: 3px; }
.share .track, .swatch .track { fill: var(--panel); }
.swatch { width: .9rem; height: .9rem; vertical-align: -2px; margin-right: .3rem; }
.legend { display: flex; gap: 1rem; flex-wrap: wrap; font-size: .85rem; color: var(--muted);
  margin: .25rem 0 0; padding: 0; list-style: none; }
.windows { display: flex; gap: .75rem; flex-wrap: wrap; margin: .5rem 0; }
.windows a[aria-current=page] { font-weight: 700; color: var(--fg); text-decoration: none; }
th a.sort { color: inherit; }
form.search { display: flex; gap: .35rem; align-items: center; }
form.search.top input { width: 16rem; max-width: 50vw; }
form.search.page { margin: .5rem 0 1rem; } form.search.page input { width: min(36rem, 100%); }
.badge.readonly { border-color: var(--warn); color: var(--warn); }
.refresh { font-size: .85rem; color: var(--muted); display: flex; gap: .5rem;
  align-items: center; }
.visually-hidden { position: absolute; width: 1px; height: 1px; overflow: hidden;
  clip: rect(0 0 0 0); white-space: nowrap; }
@media (max-width: 40rem) {
  main { padding: .6rem; }
  th, td { padding: .35rem .4rem; }
  .hide-narrow { display: none; }
  dl.props { grid-template-columns: 1fr; }
  dl.props dd { margin-bottom: .4rem; }
}
"""

JS = """\
// d1queue dashboard: refresh the live parts of the page in place (keeping
// scroll, focus, filters, paging and selections), relative times, and
// selecting many failed jobs. The page works without it.
(function () {
  "use strict";
  // Refresh every `every` ms while the tab is visible (none while hidden),
  // unless stopped; both choices kept in localStorage for the next page.
  var CHOICES = [@CHOICES@];
  var KEY = "d1queue.refresh";
  var every = 15000;
  var auto = true;
  var last = Date.now();
  var timer = null;
  var live = false;

  function load() {
    try {
      var kept = JSON.parse(window.localStorage.getItem(KEY) || "null");
      if (kept && CHOICES.indexOf(kept.every) >= 0) { every = kept.every; }
      if (kept && kept.on === false) { auto = false; }
    } catch (err) { /* storage off or unreadable: the defaults */ }
  }

  function save() {
    try {
      window.localStorage.setItem(KEY, JSON.stringify({ every: every, on: auto }));
    } catch (err) { /* storage off: the choice lasts this page */ }
  }

  function ago(ms) {
    var s = Math.round((Date.now() - ms) / 1000), future = s < 0;
    s = Math.abs(s);
    var text = s < 60 ? s + " s" : s < 3600 ? Math.floor(s / 60) + " min"
      : s < 86400 ? Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min"
      : Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
    return future ? "in " + text : text + " ago";
  }

  function relTimes(root) {
    root.querySelectorAll("[data-at]").forEach(function (el) {
      var ms = Number(el.getAttribute("data-at"));
      if (ms) { el.textContent = ago(ms); }
    });
  }

  function selection() {
    var boxes = document.querySelectorAll("input[type=checkbox][data-select]");
    var checked = 0;
    boxes.forEach(function (b) { if (b.checked) { checked++; } });
    document.querySelectorAll("[data-selected-count]").forEach(function (el) {
      el.textContent = checked + " of " + boxes.length + " selected";
    });
    document.querySelectorAll("[data-needs-selection]").forEach(function (el) {
      el.disabled = checked === 0;
    });
    var all = document.getElementById("select-all");
    if (all) {
      all.checked = boxes.length > 0 && checked === boxes.length;
      all.indeterminate = checked > 0 && checked < boxes.length;
    }
  }

  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t.id === "select-all") {
      document.querySelectorAll("input[type=checkbox][data-select]").forEach(function (b) {
        b.checked = t.checked;
      });
    }
    if (t.id === "select-all" || t.hasAttribute("data-select")) { selection(); }
  });

  function status(text) {
    var el = document.getElementById("refresh-status");
    if (el) { el.textContent = text; }
  }

  function busy() {
    // Do not pull the page from under someone using a live part of it.
    var a = document.activeElement;
    if (a && a !== document.body && a.closest("[data-live]")
        && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA")
        && a.type !== "checkbox") { return true; }
    return false;
  }

  function schedule(wait) {
    if (timer !== null) { clearTimeout(timer); timer = null; }
    if (!live || !auto || document.hidden) { return; }
    timer = setTimeout(function () {
      timer = null;
      refresh().then(function () { schedule(every); });
    }, Math.max(0, wait));
  }

  function refresh() {
    if (!auto || document.hidden || busy()) { return Promise.resolve(); }
    var sent = { credentials: "same-origin", headers: { "x-d1queue-refresh": "1" } };
    return fetch(location.href, sent)
      .then(function (r) {
        if (r.redirected || r.status === 401) { throw new Error("signed out"); }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var kept = {};
        document.querySelectorAll("input[type=checkbox][data-select]").forEach(function (b) {
          if (b.checked) { kept[b.value] = true; }
        });
        var focused = document.activeElement && document.activeElement.id;
        document.querySelectorAll("[data-live][id]").forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh) { el.innerHTML = fresh.innerHTML; }
        });
        document.querySelectorAll("input[type=checkbox][data-select]").forEach(function (b) {
          b.checked = !!kept[b.value];
        });
        if (focused) {
          var again = document.getElementById(focused);
          if (again && again !== document.activeElement) { again.focus({ preventScroll: true }); }
        }
        relTimes(document);
        selection();
        last = Date.now();
        status("Updated just now");
      })
      .catch(function (err) {
        if (String(err.message) === "signed out") {
          auto = false;
          status("Your session ended: reload the page to sign in again.");
        } else {
          status("Could not refresh (" + err.message + "); retrying.");
        }
      });
  }

  function said() {
    return auto ? "Auto-refresh every " + every / 1000 + " s" : "Auto-refresh is off";
  }

  function showControl() {
    var t = document.getElementById("refresh-toggle");
    if (t) {
      t.setAttribute("aria-pressed", String(auto));
      t.textContent = auto ? "Stop auto-refresh" : "Start auto-refresh";
    }
    var pick = document.getElementById("refresh-every");
    if (pick) { pick.value = String(every); }
  }

  document.addEventListener("click", function (e) {
    var t = e.target.closest("#refresh-toggle");
    if (!t) { return; }
    auto = !auto;
    save();
    showControl();
    status(said());
    if (auto) { refresh().then(function () { schedule(every); }); } else { schedule(0); }
  });

  document.addEventListener("change", function (e) {
    if (e.target.id !== "refresh-every") { return; }
    var ms = Number(e.target.value);
    if (CHOICES.indexOf(ms) < 0) { return; }
    every = ms;
    save();
    status(said());
    schedule(every - (Date.now() - last));
  });

  document.addEventListener("visibilitychange", function () {
    carryOn();  // a bulk action's next step, whatever the refresh
    if (!live) { return; }
    if (document.hidden) {
      schedule(0);  // clears the timer: nothing is fetched while hidden
      if (auto) { status("Paused while the tab is hidden"); }
    } else if (auto) {
      status(said());
      schedule(every - (Date.now() - last));  // at once when overdue
    }
  });

  // A bulk action's next step (its "Continue" form), sent while the tab is
  // visible; each step is safe to send again, and the button stays there.
  var sent = false;
  function carryOn() {
    var form = document.querySelector("form[data-continue]");
    if (!form || sent || document.hidden) { return; }
    sent = true;
    setTimeout(function () { form.submit(); }, 300);
  }

  document.addEventListener("DOMContentLoaded", function () {
    live = !!document.querySelector("[data-live]");
    var panel = document.getElementById("refresh");
    if (panel) { panel.hidden = !live; }
    load();
    showControl();
    relTimes(document);
    selection();
    carryOn();
    if (live) {
      status(said());
      schedule(every);
      setInterval(function () {
        relTimes(document);
        if (auto && !document.hidden && Date.now() - last > 1000) {
          status("Updated " + ago(last) + " (every " + every / 1000 + " s)");
        }
      }, 5000);
    }
  });
})();
"""


REFRESH_EVERY_S = (2, 5, 15, 30, 60)
"""The live pages' refresh intervals the header offers (html.frame) and the
script accepts (its CHOICES, in ms); 15 s unless the browser kept another."""
JS = JS.replace("@CHOICES@", ", ".join(str(s * 1000) for s in REFRESH_EVERY_S))

ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#0b57d0"/>'
    '<path d="M4 5h8M4 8h8M4 11h5" stroke="#fff" stroke-width="1.6"/></svg>'
)
"""The tab's icon: without one the browser asks for /favicon.ico, which the
API answers 401."""


def _version(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


CSS_PATH = f"/ui/static/app.{_version(CSS)}.css"
JS_PATH = f"/ui/static/app.{_version(JS)}.js"
ICON_PATH = f"/ui/static/icon.{_version(ICON)}.svg"
"""Content-addressed paths: a page names the exact asset it was built with,
so a browser may cache an asset for good and a deploy never mixes versions."""

ASSETS: dict[str, tuple[str, str]] = {
    CSS_PATH: ("text/css; charset=utf-8", CSS),
    JS_PATH: ("text/javascript; charset=utf-8", JS),
    ICON_PATH: ("image/svg+xml", ICON),
}
