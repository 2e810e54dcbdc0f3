// The do-it-yourself alternative a small team would write instead of walgate (issue 13's peer):
// a Node.js gateway on npm pg-logical-replication (pgoutput) and ws, broadcasting each change as
// JSON to every connected WebSocket client. Started by walgate-bench-fanout, like a walgate:
//   node peer.mjs PGHOST PGPORT SLOT PUBLICATION PORT     (user and database postgres; the slot exists)
// It is a benchmark peer, not a product: no log, no resume, no filters, acknowledged as received.
// permessage-deflate is negotiated when the client offers it, with ws's defaults: with context
// takeover (what browsers offer) every message is compressed in the connection's own zlib
// context (ws's 1 KiB threshold applies only under no_context_takeover).
import { LogicalReplicationService, PgoutputPlugin } from 'pg-logical-replication';
import { WebSocketServer } from 'ws';

const [pgHost, pgPort, slot, publication, port] = process.argv.slice(2);
const wss = new WebSocketServer({ host: '127.0.0.1', port: Number(port), perMessageDeflate: true });

// The change as JSON, with what a client needs to place it (as walgate's native event does).
let commitLsn = null;
let index = 0;
const service = new LogicalReplicationService({ host: pgHost, port: Number(pgPort), user: 'postgres', database: 'postgres' }, { acknowledge: { auto: true, timeoutSeconds: 10 } });
service.on('data', (lsn, m) => {
  if (m.tag === 'begin') {
    commitLsn = m.commitLsn;
    index = 0;
    return;
  }
  if (m.tag !== 'insert' && m.tag !== 'update' && m.tag !== 'delete') return;
  const text = JSON.stringify({
    id: `${commitLsn}:${index++}`,
    op: m.tag,
    schema: m.relation.schema,
    table: m.relation.name,
    after: m.new ?? null,
    before: m.old ?? m.key ?? null,
  });
  for (const client of wss.clients) if (client.readyState === 1) client.send(text);
});
service.on('error', (e) => console.error('peer:', e.message));
const plugin = new PgoutputPlugin({ protoVersion: 1, publicationNames: [publication] });
(function subscribe() {
  service
    .subscribe(plugin, slot)
    .catch((e) => console.error('peer:', e.message))
    .then(() => setTimeout(subscribe, 100));
})();
process.on('SIGINT', () => process.exit(0));
process.on('SIGTERM', () => process.exit(0));
