// count is a keyed operator: it keeps a running count per key in the key's
// state and emits (key, count as decimal ASCII, time) per record. The
// AssemblyScript port of operators/examples/count.
import { Context, Record, register, parseU64, str, utf8 } from "../../sdk-as/cairn";
export { cairn_alloc, cairn_process, cairn_progress } from "../../sdk-as/cairn";

function onRecord(c: Context, r: Record): bool {
  let n: u64 = 0;
  const v = c.get("");
  if (v) {
    n = parseU64(v);
    if (n == u64.MAX_VALUE) return c.error("count: corrupt state \"" + str(v) + "\"");
  }
  const out = utf8((n + 1).toString());
  c.put("", out);
  c.emit(r.key, out, r.time);
  return true;
}

register(onRecord);
