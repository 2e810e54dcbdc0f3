// Headless Chromium (Debian's chromium, driven by playwright-core) against `walgate demo`: the
// live page shows changes, and an EventSource and a WebSocket opened in the page each receive a
// change made by SQL (the demo's trickle of INSERT/UPDATE/DELETE statements).
//   node live_page.test.mjs PATH/TO/walgate [screenshot.png]
import { spawn } from 'node:child_process';
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
  await check('a WebSocket receives a change', async () => {
    const msg = await page.evaluate((p) => new Promise((resolve, reject) => {
      const ws = new WebSocket(`ws://127.0.0.1:${p}/v1/ws?format=waltail`);
      const t = setTimeout(() => reject(new Error('no message in 30 s')), 30000);
      ws.onmessage = (m) => { clearTimeout(t); ws.close(); resolve(JSON.parse(m.data)); };
      ws.onerror = () => reject(new Error('WebSocket error'));
    }), port);
    if (!msg.idempotency_key || !msg.table.startsWith('public.')) throw new Error(JSON.stringify(msg));
  });
  await check('the live page lists a logical decoding message under its prefix, not as a table', async () => {
    const seen = await page.evaluate(() => {
      render({ id: '0/1:0', op: 'message', transactional: false, prefix: 'walgate-test', content: 'hello' });
      const row = document.getElementById('latest').rows[1];
      return { cells: [...row.cells].map((c) => c.textContent), undefinedTable: !!document.getElementById('t-undefined.undefined') };
    });
    if (seen.cells[1] !== 'message' || seen.cells[2] !== 'message walgate-test' || seen.cells[3] !== 'hello')
      throw new Error(JSON.stringify(seen.cells));
    if (seen.undefinedTable) throw new Error('a table row "undefined.undefined" was made');
  });
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
} finally {
  await browser.close();
}
demo.kill('SIGINT');
const code = await new Promise((resolve) => demo.on('exit', (c) => resolve(c)));
await check('walgate demo stops cleanly on SIGINT', async () => { if (code !== 0) throw new Error(`exit ${code}`); });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
