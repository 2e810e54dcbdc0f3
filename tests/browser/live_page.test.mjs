// Headless Chromium (Debian's chromium, driven by playwright-core) against `walgate demo`: the
// live page shows changes, and a table's rows from its snapshot kept equal to SELECT through a
// burst of changes (the screenshot, when asked for, is of that page); an EventSource and a
// WebSocket opened in the page (permessage-deflate negotiated) each receive a
// change made by SQL (the demo's trickle of INSERT/UPDATE/DELETE statements); an EventSource
// opened with from= in its URL gets every change exactly once across a gateway killed and
// restarted in the middle (a second walgate on the demo's database); one WebSocket on /v1/mux
// carries two subscriptions, one unsubscribed and resumed from the id it was given; with
// --auth jwt, an EventSource with access_token= and a WebSocket with the bearer subprotocol are
// served, one without a token is not, and when the token expires each says where to resume and a
// fresh token resumes there.
//   node live_page.test.mjs PATH/TO/walgate [screenshot.png]
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, readdirSync, writeFileSync } from 'node:fs';
import { createHmac } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:net';
import { chromium } from 'playwright-core';

const walgate = process.argv[2];
const screenshot = process.argv[3];
const freePort = () => new Promise((resolve) => {
  const s = createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

let passed = 0, failed = 0;
async function check(name, fn) {
  try { await fn(); passed++; console.log(`ok - ${name}`); }
  catch (e) { failed++; console.log(`not ok - ${name}: ${e.message}`); }
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const demo = spawn(walgate, ['demo', '--listen', `127.0.0.1:${port}`], { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
demo.stderr.on('data', (d) => { log += d; });
const ready = await new Promise((resolve) => {
  const t = setTimeout(() => resolve(false), 60000);
  const poll = setInterval(() => { if (log.includes('Ctrl-C stops')) { clearTimeout(t); clearInterval(poll); resolve(true); } }, 100);
});
if (!ready) { console.log(log); demo.kill('SIGKILL'); console.log('0 passed, 1 failed'); process.exit(1); }

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  await page.goto(base + '/');
  await check('the live page shows a change', async () => {
    await page.waitForSelector('#latest tr:nth-child(2)', { timeout: 30000 });
    const status = await page.textContent('#status');
    if (status !== 'live') throw new Error(`status is "${status}"`);
  });
  await check('an EventSource receives a change', async () => {
    const ev = await page.evaluate(() => new Promise((resolve, reject) => {
      const es = new EventSource('/v1/stream?format=debezium');
      const t = setTimeout(() => reject(new Error('no event in 30 s')), 30000);
      es.onmessage = (m) => { clearTimeout(t); es.close(); resolve({ id: m.lastEventId, data: JSON.parse(m.data) }); };
    }));
    if (!/^[0-9A-F]+\/[0-9A-F]+:\d+$/.test(ev.id)) throw new Error(`bad id ${ev.id}`);
    if (ev.data.source.connector !== 'postgresql') throw new Error('not a Debezium event');
  });
  await check('a WebSocket receives changes, with the permessage-deflate Chromium offers (no server context takeover)', async () => {
    const got = await page.evaluate((p) => new Promise((resolve, reject) => {
      const ws = new WebSocket(`ws://127.0.0.1:${p}/v1/ws?format=waltail`);
      const t = setTimeout(() => reject(new Error('no messages in 30 s')), 30000);
      const msgs = [];
      ws.onmessage = (m) => {
        msgs.push(JSON.parse(m.data));
        if (msgs.length === 5) { clearTimeout(t); const extensions = ws.extensions; ws.close(); resolve({ msgs, extensions }); }
      };
      ws.onerror = () => reject(new Error('WebSocket error'));
    }), port);
    for (const msg of got.msgs)
      if (!msg.idempotency_key || !msg.table.startsWith('public.')) throw new Error(JSON.stringify(msg));
    if (!got.extensions.includes('permessage-deflate') || !got.extensions.includes('server_no_context_takeover'))
      throw new Error(`negotiated: "${got.extensions}"`);
  });
  await check('the live page lists a logical decoding message under its prefix, not as a table', async () => {
    const seen = await page.evaluate(() => {
      showMessage({ id: '0/1:0', op: 'message', transactional: false, prefix: 'walgate-test', content: 'hello' });
      const row = document.getElementById('latest').rows[1];
      return { cells: [...row.cells].map((c) => c.textContent), undefinedTable: !!document.getElementById('t-undefined.undefined') };
    });
    if (seen.cells[1] !== 'message' || seen.cells[2] !== 'message walgate-test' || seen.cells[3] !== 'hello')
      throw new Error(JSON.stringify(seen.cells));
    if (seen.undefinedTable) throw new Error('a table row "undefined.undefined" was made');
  });
  const m = log.match(/psql\s+psql '([^']+)'/);
  const conninfo = m ? m[1] : '';
  const psql = ['/usr/lib/postgresql/15/bin/psql', ...readdirSync('/usr/lib/postgresql').map((v) => `/usr/lib/postgresql/${v}/bin/psql`)]
    .find((p) => existsSync(p));
  const sql = (q) => execFileSync(psql, [conninfo, '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', q], { encoding: 'utf8' });
  await check('the live page shows a table\'s rows from its snapshot, updated in place: they equal SELECT after a burst', async () => {
    if (!conninfo) throw new Error('the demo printed no conninfo');
    if (!psql) throw new Error('no psql');
    sql('CREATE TABLE browser_rows(id int PRIMARY KEY, label text, n int);' +
        "INSERT INTO browser_rows SELECT g, 'row ' || g, 0 FROM generate_series(1, 30) g");
    const p3 = await browser.newPage();
    try {
      await p3.goto(base + '/');
      await p3.waitForFunction(() => window.snapshotDone === true, null, { timeout: 30000 });
      const first = await p3.evaluate(() => rowsOf('public.browser_rows').length);
      if (first !== 30) throw new Error(`${first} rows from the snapshot, expected 30`);
      let burst = "INSERT INTO browser_rows SELECT g, 'new ' || g, 1 FROM generate_series(31, 60) g;";
      for (let i = 1; i <= 20; i++) burst += `UPDATE browser_rows SET n = n + ${i}, label = 'changed ${i}' WHERE id = ${i};`;
      burst += 'DELETE FROM browser_rows WHERE id BETWEEN 5 AND 10; UPDATE browser_rows SET id = 1001 WHERE id = 1;';
      sql(burst);
      const want = JSON.parse(sql('SELECT json_agg(json_build_object(\'id\', id, \'label\', label, \'n\', n) ORDER BY id) FROM browser_rows'));
      let got = [];
      for (let i = 0; i < 200; i++) {
        got = await p3.evaluate(() => rowsOf('public.browser_rows').sort((a, b) => a.id - b.id));
        if (JSON.stringify(got) === JSON.stringify(want)) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      if (JSON.stringify(got) !== JSON.stringify(want))
        throw new Error(`the page holds ${JSON.stringify(got).slice(0, 300)}, SELECT ${JSON.stringify(want).slice(0, 300)}`);
      await new Promise((r) => setTimeout(r, 1000));   // the deleted rows' fade is over
      const drawn = await p3.evaluate(() => document.getElementById('table-public.browser_rows').querySelectorAll('table.rows tr').length);
      if (drawn !== want.length + 1) throw new Error(`${drawn - 1} rows drawn, ${want.length} in the table`);
      if (screenshot) {   // (a few more points on the chart first)
        await new Promise((r) => setTimeout(r, 12000));
        await p3.screenshot({ path: screenshot, fullPage: true });
      }
    } finally {
      await p3.close();
    }
  });
  await check('an EventSource with from= in its URL: every change once across a gateway restart', async () => {
    if (!conninfo) throw new Error('the demo printed no conninfo');
    if (!psql) throw new Error('no psql');
    const dir = mkdtempSync(join(tmpdir(), 'walgate-browser-'));
    const port2 = await freePort();
    let glog = '';
    const start = async () => {
      const g = spawn(walgate, ['--pg', conninfo, '--slot', 'browser_restart', '--publication', 'walgate_demo',
        '--data-dir', dir, '--listen', `127.0.0.1:${port2}`], { stdio: ['ignore', 'ignore', 'pipe'] });
      g.stderr.on('data', (d) => { glog += d; });
      for (let i = 0; i < 300 && !glog.includes('listening on'); i++) await new Promise((r) => setTimeout(r, 100));
      // streaming: its slot exists, so what is inserted from now on reaches it
      for (let i = 0; i < 300; i++) {
        if (sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'browser_restart' AND active").trim() === '1') break;
        await new Promise((r) => setTimeout(r, 100));
      }
      return g;
    };
    let g = await start();
    const p2 = await browser.newPage();
    try {
      await p2.goto(`http://127.0.0.1:${port2}/`);
      const from = '0/0:0';
      await p2.evaluate((f) => {
        window.got = [];
        window.es = new EventSource(`/v1/stream?format=native&tables=public.customers&from=${f}`);
        window.es.onmessage = (m) => {
          const e = JSON.parse(m.data);
          if (e.op === 'insert' && e.after.name.startsWith('browser-')) window.got.push(e.after.name);
        };
      }, from);
      const insert = (lo, hi) => {
        let q = '';
        for (let i = lo; i <= hi; i++) q += `INSERT INTO customers(name) VALUES ('browser-${i}');`;
        sql(q);
      };
      const waitFor = async (n) => {
        for (let i = 0; i < 600; i++) {
          if ((await p2.evaluate(() => window.got.length)) >= n) return;
          await new Promise((r) => setTimeout(r, 100));
        }
      };
      insert(1, 200);
      await waitFor(200);
      g.kill('SIGKILL');   // the gateway dies; the EventSource reconnects (with Last-Event-ID) to the next one
      await new Promise((r) => g.on('exit', r));
      g = await start();
      insert(201, 400);
      await waitFor(400);
      await new Promise((r) => setTimeout(r, 3000));   // anything sent twice would have come by now
      const got = await p2.evaluate(() => { window.es.close(); return window.got; });
      const unique = new Set(got);
      if (got.length !== 400 || unique.size !== 400)
        throw new Error(`${got.length} events, ${unique.size} distinct rows (expected 400 of each)\n${glog}`);
      for (let i = 1; i <= 400; i++) if (!unique.has(`browser-${i}`)) throw new Error(`browser-${i} missing`);
      const order = got.map((n) => Number(n.slice(8)));
      for (let i = 1; i < order.length; i++) if (order[i] < order[i - 1]) throw new Error(`out of order at ${i}`);
    } finally {
      await p2.close();
      g.kill('SIGINT');
      await new Promise((r) => g.on('exit', r));
      try { sql("SELECT pg_drop_replication_slot('browser_restart')"); } catch (e) { /* the demo's server goes anyway */ }
      rmSync(dir, { recursive: true, force: true });
    }
  });
  await check('one WebSocket, many subscriptions (/v1/mux): envelopes, compressed, unsubscribe, resume one from its id', async () => {
    if (!conninfo) throw new Error('the demo printed no conninfo');
    sql('CREATE TABLE browser_mux_a(id int PRIMARY KEY, note text); CREATE TABLE browser_mux_b(id int PRIMARY KEY, note text)');
    const p4 = await browser.newPage();
    try {
      await p4.goto(base + '/');
      await p4.evaluate((p) => new Promise((resolve, reject) => {
        const ws = new WebSocket(`ws://127.0.0.1:${p}/v1/mux`);
        window.mux = { ws, msgs: [] };
        ws.onmessage = (m) => window.mux.msgs.push(JSON.parse(m.data));
        ws.onerror = () => reject(new Error('WebSocket error'));
        ws.onopen = () => {
          ws.send(JSON.stringify({ type: 'subscribe', id: 'a', tables: 'public.browser_mux_a' }));
          ws.send(JSON.stringify({ type: 'subscribe', id: 'b', format: 'waltail', tables: ['public.browser_mux_b'], ops: ['insert'] }));
          resolve();
        };
      }), port);
      const msgs = () => p4.evaluate(() => window.mux.msgs);
      const until = async (f, what) => {
        for (let i = 0; i < 300; i++) {
          const m = await msgs();
          if (f(m)) return m;
          await new Promise((r) => setTimeout(r, 100));
        }
        throw new Error(`${what}: ${JSON.stringify(await msgs()).slice(0, 600)}`);
      };
      const send = (o) => p4.evaluate((t) => window.mux.ws.send(t), JSON.stringify(o));
      await until((m) => m.filter((x) => x.type === 'subscribed').length === 2, 'both subscribed');
      const deflated = async () => Number((await p4.evaluate(() => fetch('/metrics').then((r) => r.text())))
        .match(/\nwalgate_ws_deflated_total (\d+)/)[1]);
      const deflated0 = await deflated();
      sql("INSERT INTO browser_mux_a SELECT g, repeat('walgate ', 100) || g FROM generate_series(1, 5) g;" +
          "INSERT INTO browser_mux_b SELECT g, 'b' || g FROM generate_series(1, 5) g; UPDATE browser_mux_b SET note = 'x'");
      let m = await until((m) => m.filter((x) => 'data' in x).length >= 10, 'ten events');
      const a = m.filter((x) => x.sub === 'a' && 'data' in x), b = m.filter((x) => x.sub === 'b' && 'data' in x);
      if (a.length !== 5 || b.length !== 5) throw new Error(`a ${a.length}, b ${b.length}`);
      a.forEach((x, i) => {
        if (x.data.op !== 'insert' || x.data.after.id !== i + 1 || x.id !== x.data.id) throw new Error(JSON.stringify(x).slice(0, 300));
      });
      for (const x of b)
        if (x.data.table !== 'public.browser_mux_b' || !/^[0-9A-F]+\/[0-9A-F]+:\d+$/.test(x.id)) throw new Error(JSON.stringify(x));
      const extensions = await p4.evaluate(() => window.mux.ws.extensions);
      if (!extensions.includes('permessage-deflate')) throw new Error(`negotiated: "${extensions}"`);
      // a's five events (800 bytes each) went out compressed: only a compressing client asks for that
      const made = (await deflated()) - deflated0;
      if (made < 5) throw new Error(`${made} events compressed`);
      await send({ type: 'unsubscribe', id: 'a' });
      m = await until((m) => m.some((x) => x.sub === 'a' && x.type === 'end'), 'the end of a');
      const end = m.find((x) => x.sub === 'a' && x.type === 'end');
      if (end.reason !== 'unsubscribed' || end.resume_from !== a[4].id) throw new Error(JSON.stringify(end));
      sql("INSERT INTO browser_mux_a SELECT g, 'later ' || g FROM generate_series(6, 8) g; INSERT INTO browser_mux_b VALUES (6, 'b6')");
      await until((m) => m.filter((x) => x.sub === 'b' && 'data' in x).length === 6, 'b goes on');
      if ((await msgs()).filter((x) => x.sub === 'a' && 'data' in x).length !== 5) throw new Error('a after its end');
      await send({ type: 'subscribe', id: 'a2', tables: 'public.browser_mux_a', from: a[2].id });
      m = await until((m) => m.filter((x) => x.sub === 'a2' && 'data' in x).length >= 5, 'a2 resumed');
      await new Promise((r) => setTimeout(r, 500));   // anything sent twice would have come by now
      const ids = (await msgs()).filter((x) => x.sub === 'a2' && 'data' in x).map((x) => x.data.after.id);
      if (JSON.stringify(ids) !== JSON.stringify([4, 5, 6, 7, 8])) throw new Error(`a2 got ${JSON.stringify(ids)}`);
    } finally {
      await p4.close();
    }
  });
  await check('--auth jwt: access_token on an EventSource, the bearer subprotocol on a WebSocket, expiry and resume', async () => {
    if (!conninfo) throw new Error('the demo printed no conninfo');
    const dir = mkdtempSync(join(tmpdir(), 'walgate-browser-auth-'));
    const secret = 'a browser test secret of 32 bytes or more';
    writeFileSync(join(dir, 'secret'), secret + '\n');
    const token = (expIn) => {
      const b64u = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
      const input = `${b64u({ alg: 'HS256', typ: 'JWT' })}.${b64u({ sub: 'browser', exp: Math.floor(Date.now() / 1000) + expIn })}`;
      return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
    };
    const port3 = await freePort();
    let glog = '';
    const g = spawn(walgate, ['--pg', conninfo, '--slot', 'browser_auth', '--publication', 'walgate_demo',
      '--data-dir', join(dir, 'data'), '--listen', `127.0.0.1:${port3}`, '--auth', 'jwt',
      '--jwt-secret-file', join(dir, 'secret'), '--jwt-leeway', '0', '--snapshot', 'never'], { stdio: ['ignore', 'ignore', 'pipe'] });
    g.stderr.on('data', (d) => { glog += d; });
    const p5 = await browser.newPage();
    try {
      for (let i = 0; i < 300 && !glog.includes('listening on'); i++) await new Promise((r) => setTimeout(r, 100));
      for (let i = 0; i < 300; i++) {
        if (sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'browser_auth' AND active").trim() === '1') break;
        await new Promise((r) => setTimeout(r, 100));
      }
      await p5.goto(`http://127.0.0.1:${port3}/healthz`);
      // Without a token: the EventSource fails (401) and gives up; the WebSocket is refused.
      const refused = await p5.evaluate((p) => new Promise((resolve) => {
        const es = new EventSource('/v1/stream');
        es.onerror = () => {
          const state = es.readyState;
          const ws = new WebSocket(`ws://127.0.0.1:${p}/v1/ws`);
          ws.onopen = () => resolve({ state, ws: 'open' });
          ws.onclose = (c) => resolve({ state, ws: c.code });
        };
      }), port3);
      if (refused.state !== 2 || refused.ws !== 1006) throw new Error(`without a token: ${JSON.stringify(refused)}`);
      const brief = token(5);
      await p5.evaluate(({ p, t }) => new Promise((resolve, reject) => {
        window.es_got = []; window.ws_got = []; window.es_end = null; window.ws_end = null;
        window.es = new EventSource(`/v1/stream?format=native&tables=public.customers&access_token=${t}`);
        window.es.onmessage = (m) => window.es_got.push(JSON.parse(m.data));
        window.es.addEventListener('error', (e) => { if (e.data) { window.es_end = JSON.parse(e.data); window.es.close(); } });
        const ws = new WebSocket(`ws://127.0.0.1:${p}/v1/ws?format=native&tables=public.customers`, ['walgate', `bearer.${t}`]);
        ws.onmessage = (m) => window.ws_got.push(JSON.parse(m.data));
        ws.onclose = (c) => { window.ws_end = { code: c.code, reason: c.reason }; };
        ws.onopen = () => { window.ws_protocol = ws.protocol; resolve(); };
        setTimeout(() => reject(new Error('the WebSocket did not open')), 10000);
      }), { p: port3, t: brief });
      if ((await p5.evaluate(() => window.ws_protocol)) !== 'walgate') throw new Error('the answer did not name walgate');
      await new Promise((r) => setTimeout(r, 300));
      sql("INSERT INTO customers(name) SELECT 'auth-' || g FROM generate_series(1, 3) g");
      let st;
      for (let i = 0; i < 150; i++) {
        st = await p5.evaluate(() => ({ es: window.es_got.length, ws: window.ws_got.length, es_end: window.es_end, ws_end: window.ws_end }));
        if (st.es_end && st.ws_end) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const names = (list) => list.filter((e) => e.op === 'insert' && e.after.name.startsWith('auth-')).map((e) => e.after.name);
      const got = await p5.evaluate(() => ({ es: window.es_got, ws: window.ws_got }));
      if (JSON.stringify(names(got.es)) !== '["auth-1","auth-2","auth-3"]') throw new Error(`EventSource got ${JSON.stringify(names(got.es))}`);
      if (JSON.stringify(names(got.ws)) !== '["auth-1","auth-2","auth-3"]') throw new Error(`WebSocket got ${JSON.stringify(names(got.ws))}`);
      const lastEs = got.es[got.es.length - 1].id, lastWs = got.ws[got.ws.length - 1].id;
      if (!st.es_end || st.es_end.error !== 'the token expired' || st.es_end.resume_from !== lastEs)
        throw new Error(`EventSource end: ${JSON.stringify(st.es_end)}`);
      if (!st.ws_end || st.ws_end.code !== 4001 || st.ws_end.reason !== `the token expired; resume from ${lastWs}`)
        throw new Error(`WebSocket end: ${JSON.stringify(st.ws_end)}`);
      // Changes while it was away; a fresh token and from= the id it was given: exactly those.
      sql("INSERT INTO customers(name) SELECT 'auth-' || g FROM generate_series(4, 6) g");
      const rest = await p5.evaluate(({ t, from }) => new Promise((resolve, reject) => {
        const got = [];
        const es = new EventSource(`/v1/stream?format=native&tables=public.customers&from=${from}&access_token=${t}`);
        es.onmessage = (m) => {
          const e = JSON.parse(m.data);
          if (e.op === 'insert' && e.after.name.startsWith('auth-')) got.push(e.after.name);
          if (got.length === 3) setTimeout(() => { es.close(); resolve(got); }, 500);
        };
        setTimeout(() => reject(new Error(`only ${JSON.stringify(got)}`)), 20000);
      }), { t: token(600), from: st.es_end.resume_from });
      if (JSON.stringify(rest) !== '["auth-4","auth-5","auth-6"]') throw new Error(`resumed with ${JSON.stringify(rest)}`);
      // The live page opened with ?access_token= passes it on to its streams.
      await p5.goto(`http://127.0.0.1:${port3}/?access_token=${token(600)}`);
      await p5.waitForFunction(() => document.getElementById('status').textContent === 'live', null, { timeout: 20000 });
      if (glog.includes(brief.split('.')[2])) throw new Error('a token in the log');
    } finally {
      await p5.close();
      g.kill('SIGINT');
      await new Promise((r) => g.on('exit', r));
      try { sql("SELECT pg_drop_replication_slot('browser_auth')"); } catch (e) { /* the demo's server goes anyway */ }
      rmSync(dir, { recursive: true, force: true });
    }
  });
} finally {
  await browser.close();
}
demo.kill('SIGINT');
const code = await new Promise((resolve) => demo.on('exit', (c) => resolve(c)));
await check('walgate demo stops cleanly on SIGINT', async () => { if (code !== 0) throw new Error(`exit ${code}`); });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
