// The live page served on GET /: tables, counters and the latest changes, using only the public
// endpoints (an EventSource on /v1/stream and /metrics).
namespace walgate::proxy {

extern const char* live_page_html;
const char* live_page_html = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>walgate</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
 h1{font-size:1.3em} table{border-collapse:collapse;margin-bottom:1em}
 td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
 code{font-size:12px} #status{font-weight:bold}
 .insert{color:#070}.update{color:#05a}.delete{color:#a00}.truncate{color:#a50}
</style></head>
<body>
<h1>walgate <span id="status">connecting…</span></h1>
<table id="counters"><tr><th>events received</th><td id="received">0</td></tr>
<tr><th>last event id</th><td id="lastid">–</td></tr>
<tr><th>gateway events in / out</th><td id="inout">–</td></tr></table>
<h2>Tables</h2><table id="tables"><tr><th>table</th><th>insert</th><th>update</th><th>delete</th></tr></table>
<h2>Latest changes</h2><table id="latest"><tr><th>id</th><th>op</th><th>table</th><th>row</th></tr></table>
<script>
const counts = {}; let received = 0;
function render(ev) {
  received++;
  document.getElementById('received').textContent = received;
  document.getElementById('lastid').textContent = ev.id;
  const message = ev.op === 'message';   // a logical decoding message has a prefix, no table
  const t = message ? 'message ' + ev.prefix : ev.schema + '.' + ev.table;
  if (!message) {
    counts[t] = counts[t] || {insert: 0, update: 0, delete: 0};
    if (ev.op in counts[t]) counts[t][ev.op]++;
    const tables = document.getElementById('tables');
    let row = document.getElementById('t-' + t);
    if (!row) { row = tables.insertRow(-1); row.id = 't-' + t; for (let i = 0; i < 4; i++) row.insertCell(); }
    row.cells[0].textContent = t; row.cells[1].textContent = counts[t].insert;
    row.cells[2].textContent = counts[t].update; row.cells[3].textContent = counts[t].delete;
  }
  const latest = document.getElementById('latest');
  const r = latest.insertRow(1);
  r.className = ev.op;
  [ev.id, ev.op, t].forEach(v => { r.insertCell().textContent = v; });
  const c = r.insertCell(); const code = document.createElement('code');
  code.textContent = message ? ev.content : JSON.stringify(ev.after || ev.before); c.appendChild(code);
  while (latest.rows.length > 21) latest.deleteRow(-1);
}
const es = new EventSource('/v1/stream?format=native');
es.onopen = () => { document.getElementById('status').textContent = 'live'; };
es.onerror = () => { document.getElementById('status').textContent = 'reconnecting…'; };
es.onmessage = (m) => render(JSON.parse(m.data));
async function metrics() {
  try {
    const text = await (await fetch('/metrics')).text();
    const get = (n) => (text.match(new RegExp('^' + n + ' (\\S+)', 'm')) || [])[1] || '?';
    document.getElementById('inout').textContent = get('walgate_events_in_total') + ' / ' + get('walgate_events_out_total');
  } catch (e) {}
}
metrics(); setInterval(metrics, 2000);
</script></body></html>
)HTML";

}  // namespace walgate::proxy
