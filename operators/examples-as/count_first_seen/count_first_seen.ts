// count_first_seen is version 2 of the word count's keyed stage: it keeps,
// per key, the count and the event time the key was first seen, as
// "count,first_seen" (decimal ASCII), and emits that. Its state has another
// shape than count's (a bare count), so it declares state version 2, and
// the same module migrates version-0 state: `cairn state migrate --stage
// count --with count_first_seen.wasm --config '{"first_seen": MS}'`
// (docs/UPGRADES.md). The AssemblyScript port of
// examples/upgrade/count_first_seen.
import {
  Context, Record, MigrateEntry, Migrator, config, parseU64, register, registerMigration, stateVersion, str, utf8,
} from "../../sdk-as/cairn";
export { cairn_alloc, cairn_process, cairn_progress, cairn_state_version, cairn_migrate } from "../../sdk-as/cairn";

function corrupt(c: Context, v: Uint8Array): bool {
  return c.error("count_first_seen: state \"" + str(v) + "\" is not \"count,first_seen\" (state version 2): migrate it first");
}

function onRecord(c: Context, r: Record): bool {
  let n: u64 = 0;
  let first: i64 = r.time;
  const v = c.get("");
  if (v) {
    const s = str(v);
    const comma = s.indexOf(",");
    if (comma < 0) return corrupt(c, v);
    n = parseU64(v.subarray(0, comma));
    const f = v.subarray(comma + 1);
    if (n == u64.MAX_VALUE || f.length == 0) return corrupt(c, v);
    first = I64.parseInt(str(f));
  }
  const out = utf8((n + 1).toString() + "," + first.toString());
  c.put("", out);
  c.emit(r.key, out, r.time);
  return true;
}

// firstSeen is the config's {"first_seen": N} (Unix ms; 0 without one):
// the first time of a key counted before the upgrade, which the old state
// never recorded.
let firstSeen: i64 = 0;
let firstSeenRead = false;

function readFirstSeen(): bool {
  const s = str(config()).trim();
  if (s.length == 0 || s == "{}") return true;
  const at = s.indexOf("\"first_seen\"");
  if (at < 0) return false;
  const colon = s.indexOf(":", at);
  if (colon < 0) return false;
  let end = colon + 1;
  while (end < s.length && (s.charCodeAt(end) == 32 || s.charCodeAt(end) == 45 || (s.charCodeAt(end) >= 48 && s.charCodeAt(end) <= 57))) end++;
  const num = s.substring(colon + 1, end).trim();
  if (num.length == 0) return false;
  firstSeen = I64.parseInt(num);
  return true;
}

const out = new MigrateEntry();

function migrate(m: Migrator, e: MigrateEntry): bool {
  if (!firstSeenRead) {
    if (!readFirstSeen()) return m.error("count_first_seen: config: want {\"first_seen\": MS}");
    firstSeenRead = true;
  }
  if (e.timer || e.sub.length > 0) {
    m.put(e); // count keeps nothing else: pass it on unchanged
    return true;
  }
  const n = parseU64(e.value);
  if (n == u64.MAX_VALUE) return m.error("not a version-0 count: \"" + str(e.value) + "\"");
  out.key = e.key;
  out.sub = e.sub;
  out.hasExpiry = e.hasExpiry;
  out.expiry = e.expiry;
  out.value = utf8(n.toString() + "," + firstSeen.toString());
  m.put(out);
  return true;
}

stateVersion(2);
register(onRecord);
registerMigration(2, migrate);
