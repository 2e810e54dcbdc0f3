// The live page served on GET /: each published table's current rows, updated in place as
// changes arrive (inserted rows appear, updated cells flash, deleted rows go), a small chart of
// events per second and of the gateway's lag, counters, and the latest changes — using only the
// public endpoints: an EventSource on /v1/stream?snapshot=true (pgoutput2json compact: its "s"
// says which columns are the key), one for logical decoding messages, and /metrics.
namespace walgate::proxy {

extern const char* live_page_html;
const char* live_page_html = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>walgate</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
 h1{font-size:1.3em} h2{font-size:1.1em;margin:1.2em 0 .4em} table{border-collapse:collapse;margin-bottom:.6em}
 td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
 code{font-size:12px} #status{font-weight:bold} .note{color:#666;font-size:12px}
 .insert{color:#070}.update{color:#05a}.delete{color:#a00}.truncate{color:#a50}
 @keyframes born{from{background:#bfb}to{background:none}} @keyframes flash{from{background:#fe8}to{background:none}}
 tr.born{animation:born 1.2s} td.flash{animation:flash 1.2s} tr.gone{background:#fbb;text-decoration:line-through}
 #chart{border:1px solid #ccc} .legend span{margin-right:1em}
</style></head>
<body>
<h1>walgate <span id="status">connecting…</span></h1>
<table id="counters"><tr><th>events received</th><td id="received">0</td></tr>
<tr><th>snapshot</th><td id="snapshot">loading…</td></tr>
<tr><th>last event id</th><td id="lastid">–</td></tr>
<tr><th>gateway events in / out</th><td id="inout">–</td></tr></table>
<canvas id="chart" width="600" height="120"></canvas>
<div class="legend"><span style="color:#05a">■ events/s</span><span style="color:#a50">■ lag (bytes, server WAL end − durable)</span></div>
<div id="tables"></div>
<h2>Latest changes</h2><table id="latest"><tr><th>id</th><th>op</th><th>table</th><th>row</th></tr></table>
<script>
// Per table: its columns and key positions (from "s"), and its rows by key.
const tables = new Map(); let received = 0; const shown = 100;
const ops = {C: 'read', I: 'insert', U: 'update', D: 'delete'};
function keyOf(t, values) {
  const idx = t.key.length ? t.key : t.cols.map((_, i) => i);   // no key: the whole row
  return JSON.stringify(idx.map((i) => values[i]));
}
function tableOf(name) {
  let t = tables.get(name);
  if (!t) {
    t = {name, cols: [], key: [], rows: new Map(), el: null};
    tables.set(name, t);
    const sec = document.createElement('section');
    sec.innerHTML = '<h2></h2><table class="rows"></table><div class="note"></div>';
    sec.querySelector('h2').textContent = name;
    sec.id = 'table-' + name;
    const all = document.getElementById('tables');
    const after = [...all.children].find((c) => c.id > sec.id);
    all.insertBefore(sec, after || null);
    t.el = sec;
  }
  return t;
}
function schema(t, s) {
  const cols = s.slice(1).map((c) => c[0]), key = [];
  s.slice(1).forEach((c, i) => { if (c[1]) key.push(i); });
  const changed = JSON.stringify(cols) !== JSON.stringify(t.cols) || JSON.stringify(key) !== JSON.stringify(t.key);
  t.cols = cols; t.key = key;
  if (changed) {   // the stream's key flags may differ from the snapshot's: key the rows anew
    const rows = [...t.rows.values()]; t.rows = new Map();
    rows.forEach((r) => t.rows.set(keyOf(t, r.values), r));
    const head = t.el.querySelector('table.rows');
    head.innerHTML = '';
    const tr = head.insertRow(); cols.forEach((c) => { const th = document.createElement('th'); th.textContent = c; tr.appendChild(th); });
    rows.forEach((r) => { r.tr = null; paint(t, r, ''); });
  }
}
function cell(v) { return v === null ? '∅' : typeof v === 'object' ? JSON.stringify(v) : String(v); }
function paint(t, r, cls) {
  const table = t.el.querySelector('table.rows');
  if (!r.tr) {
    if (table.rows.length > shown) return;   // beyond what is shown: counted, not drawn
    r.tr = table.insertRow(-1);
    t.cols.forEach(() => r.tr.insertCell());
    if (cls === 'born') r.tr.className = 'born';
  }
  r.values.forEach((v, i) => {
    const c = r.tr.cells[i]; if (!c) return;
    const text = cell(v);
    if (c.textContent !== text) {
      c.textContent = text;
      if (cls === 'flash') { c.classList.remove('flash'); void c.offsetWidth; c.classList.add('flash'); }
    }
  });
}
function note(t) {
  const n = t.rows.size;
  t.el.querySelector('.note').textContent = n + (n === 1 ? ' row' : ' rows') + (n > shown ? ' (the first ' + shown + ' shown)' : '');
}
function apply(ev, id) {
  if (!ev.t) return;
  const t = tableOf(ev.t);
  if (ev.s) schema(t, ev.s);
  const op = ops[ev.c];
  if (op === 'read' || op === 'insert') {
    const r = {values: ev.r, tr: null};
    const k = keyOf(t, ev.r);
    const old = t.rows.get(k);
    if (old && old.tr) old.tr.remove();
    t.rows.set(k, r); paint(t, r, op === 'insert' ? 'born' : '');
  } else if (op === 'update') {
    const from = ev.k ? JSON.stringify(ev.k) : keyOf(t, ev.r);
    const r = t.rows.get(from) || {values: ev.r, tr: null};
    ev.r.forEach((v, i) => { if (v === '__TOAST__') ev.r[i] = r.values[i]; });
    t.rows.delete(from); r.values = ev.r; t.rows.set(keyOf(t, ev.r), r); paint(t, r, 'flash');
  } else if (op === 'delete') {
    const k = JSON.stringify(ev.k); const r = t.rows.get(k);
    t.rows.delete(k);
    if (r && r.tr) { const tr = r.tr; tr.className = 'gone'; setTimeout(() => tr.remove(), 600); }
  }
  note(t);
  if (op !== 'read') latest(id || '(during the snapshot)', op, ev.t, JSON.stringify(ev.r || ev.k));
}
function latest(id, op, table, text) {
  const l = document.getElementById('latest');
  const r = l.insertRow(1); r.className = op;
  [id, op, table].forEach((v) => { r.insertCell().textContent = v; });
  const c = r.insertCell(); const code = document.createElement('code');
  code.textContent = text; c.appendChild(code);
  while (l.rows.length > 11) l.deleteRow(-1);
}
// Logical decoding messages (pgoutput2json has none): listed under their prefix.
function showMessage(ev) { latest(ev.id, 'message', 'message ' + ev.prefix, ev.content); }
// What the page holds, for tests: table -> rows as objects.
function rowsOf(name) {
  const t = tables.get(name); if (!t) return [];
  return [...t.rows.values()].map((r) => Object.fromEntries(t.cols.map((c, i) => [c, r.values[i]])));
}
let perSecond = 0; const series = [];
// With --auth jwt the page is opened as /?access_token=<token>: its streams carry it.
const token = new URLSearchParams(location.search).get('access_token');
const auth = token ? '&access_token=' + encodeURIComponent(token) : '';
const es = new EventSource('/v1/stream?format=pgoutput2json&compact=true&snapshot=true' + auth);
es.onopen = () => { document.getElementById('status').textContent = 'live'; };
es.onerror = () => {
  document.getElementById('status').textContent = 'reconnecting…';
  // EventSource reconnects by itself: after the snapshot's end with Last-Event-ID (it resumes),
  // before it without (a new snapshot comes, whole): then what was shown is dropped.
  if (!window.snapshotDone) { tables.clear(); document.getElementById('tables').innerHTML = ''; }
};
es.addEventListener('snapshot-end', (m) => {
  const e = JSON.parse(m.data);
  document.getElementById('snapshot').textContent = e.rows + ' rows, then live from ' + e.resume_from;
  window.snapshotDone = true;
});
es.onmessage = (m) => {
  const ev = JSON.parse(m.data);
  received++; perSecond++;
  document.getElementById('received').textContent = received;
  if (m.lastEventId) document.getElementById('lastid').textContent = m.lastEventId;
  apply(ev, m.lastEventId);
};
const messages = new EventSource('/v1/stream?ops=message' + auth);
messages.onmessage = (m) => showMessage(JSON.parse(m.data));
function chart(lag) {
  series.push({eps: perSecond / 2, lag}); perSecond = 0;
  while (series.length > 60) series.shift();
  const c = document.getElementById('chart'), g = c.getContext('2d');
  g.clearRect(0, 0, c.width, c.height);
  const line = (f, color) => {
    const max = Math.max(1, ...series.map(f));
    g.strokeStyle = color; g.beginPath();
    series.forEach((p, i) => { const x = i * (c.width / 59), y = c.height - 4 - (f(p) / max) * (c.height - 20); i ? g.lineTo(x, y) : g.moveTo(x, y); });
    g.stroke(); g.fillStyle = color; g.fillText(String(Math.round(max)), 4 + (color === '#a50' ? 80 : 0), 12);
  };
  line((p) => p.eps, '#05a'); line((p) => p.lag, '#a50');
}
async function metrics() {
  let lag = 0;
  try {
    // (with --auth jwt, /metrics answers a token with the admin claim, in the header only)
    const text = await (await fetch('/metrics', token ? { headers: { Authorization: 'Bearer ' + token } } : {})).text();
    const get = (n) => (text.match(new RegExp('^' + n + ' (\\S+)', 'm')) || [])[1] || '?';
    document.getElementById('inout').textContent = get('walgate_events_in_total') + ' / ' + get('walgate_events_out_total');
    lag = Number(get('walgate_lag_bytes')) || 0;
  } catch (e) {}
  chart(lag);
}
metrics(); setInterval(metrics, 2000);
</script></body></html>
)HTML";

}  // namespace walgate::proxy
