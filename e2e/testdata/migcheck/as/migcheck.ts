// migcheck: the AssemblyScript twin of ../go (see there).
import { Context, Record, MigrateEntry, Migrator, register, registerMigration, str, utf8 } from "../../../../operators/sdk-as/cairn";
export { cairn_alloc, cairn_process, cairn_progress, cairn_state_version, cairn_migrate } from "../../../../operators/sdk-as/cairn";

function onRecord(c: Context, r: Record): bool {
  return true;
}

const out = new MigrateEntry();

function migrate(m: Migrator, e: MigrateEntry): bool {
  const key = str(e.key);
  if (key == "bad") return m.error("bad key");
  if (key == "boom") throw new Error("boom");
  if (e.timer) {
    e.time += 10;
    m.put(e);
    return true;
  }
  const sub = str(e.sub);
  if (sub.startsWith("drop")) return true;
  const val = new Uint8Array(3 + e.value.length);
  val.set(utf8("v2:"));
  val.set(e.value, 3);
  out.key = e.key;
  out.sub = e.sub;
  out.value = val;
  out.hasExpiry = e.hasExpiry;
  out.expiry = e.hasExpiry ? e.expiry + 1000 : 0;
  m.put(out);
  out.sub = utf8(sub + ".copy");
  out.hasExpiry = false;
  out.expiry = 0;
  m.put(out);
  return true;
}

register(onRecord);
registerMigration(5, migrate);
