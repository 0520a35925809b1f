// sdkcheck: the AssemblyScript twin of ../go/main.go (see there):
// exercises the whole AssemblyScript SDK from commands in the record values.
import { Context, Record, Timer, LevelInfo, register, str, utf8 } from "../../../../operators/sdk-as/cairn";
export { cairn_alloc, cairn_process, cairn_progress } from "../../../../operators/sdk-as/cairn";

function sub(s: string): string {
  return s == "-" ? "" : s;
}

function sum(v: Uint8Array): string {
  let n: u64 = 0;
  for (let i = 0; i < v.length; i++) n += v[i];
  return v.length.toString() + ":" + n.toString();
}

function num(s: string): i64 {
  let n: i64 = 0;
  for (let i = 0; i < s.length; i++) n = n * 10 + (s.charCodeAt(i) - 48);
  return n;
}

function onRecord(c: Context, r: Record): bool {
  const f = str(r.value).split(" ");
  while (f.length < 3) f.push("");
  const cmd = f[0];
  if (cmd == "put") {
    const n = <i32>num(f[2]);
    const v = new Uint8Array(n);
    for (let i = 0; i < n; i++) v[i] = <u8>(97 + (i % 26));
    c.put(sub(f[1]), v);
  } else if (cmd == "get") {
    const v = c.get(sub(f[1]));
    c.emit(r.key, utf8(v ? f[1] + "=" + sum(v) : f[1] + "=absent"), r.time);
  } else if (cmd == "del") {
    c.delete(sub(f[1]));
  } else if (cmd == "scan") {
    const es = c.scan(sub(f[1]));
    const parts: Array<string> = [];
    for (let i = 0; i < es.length; i++) parts.push(es[i].sub + "=" + sum(es[i].value));
    c.emit(r.key, utf8(parts.join(",")), r.time);
  } else if (cmd == "etimer") {
    c.registerEventTimer(num(f[1]));
  } else if (cmd == "edel") {
    c.deleteEventTimer(num(f[1]));
  } else if (cmd == "ptimer") {
    c.registerProcessingTimer(num(f[1]));
  } else if (cmd == "pdel") {
    c.deleteProcessingTimer(num(f[1]));
  } else if (cmd == "info") {
    c.emit(r.key, utf8("pt=" + c.procTime().toString() + " cfg=" + str(c.config()) + " key=" + str(c.key())), r.time);
  } else if (cmd == "log") {
    c.log(LevelInfo, "sdkcheck logs");
  } else if (cmd == "rekey") {
    c.emit(utf8(f[1]), utf8("moved"), r.time);
  } else if (cmd == "fail") {
    return c.error("failed on purpose");
  } else if (cmd == "crash") {
    assert(false, "crashed on purpose");
  }
  return true;
}

function onTimer(c: Context, t: Timer): bool {
  c.emit(t.key, utf8("timer " + (t.processing ? "p" : "e") + " " + t.time.toString()), t.time);
  return true;
}

register(onRecord, onTimer);
