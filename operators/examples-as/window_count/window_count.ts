// window_count is a keyed operator counting records per key in tumbling
// windows. Config: {"size_ms": N, "time": "event"|"processing"} (defaults
// 60000 and "event"). The count of the window starting at s lives in state
// sub-key s (decimal); a timer of the window's domain at its end - 1 emits
// (key, "start,count", end - 1) for every window of the key that has ended
// (found with scan) and deletes their state. The AssemblyScript port of
// operators/examples/window_count.
import { Context, Record, Timer, config, logNow, LevelError, register, parseU64, str, utf8 } from "../../sdk-as/cairn";
export { cairn_alloc, cairn_process, cairn_progress } from "../../sdk-as/cairn";

let size: i64 = 60000;
let processing = false;

/** jsonField returns the raw text of a top-level field of a flat JSON
 * object (a number, or a string with its quotes), or null. */
function jsonField(json: string, name: string): string | null {
  const pat = "\"" + name + "\"";
  let at = json.indexOf(pat);
  if (at < 0) return null;
  let rest = json.substring(at + pat.length).trimStart();
  if (!rest.startsWith(":")) return null;
  rest = rest.substring(1).trimStart();
  let end = 0;
  if (rest.startsWith("\"")) {
    end = rest.indexOf("\"", 1) + 1;
  } else {
    while (end < rest.length && rest.charAt(end) != "," && rest.charAt(end) != "}" && rest.charAt(end) != " ") end++;
  }
  return rest.substring(0, end);
}

function parseI64(s: string): i64 {
  let neg = s.startsWith("-");
  const n = <i64>parseU64(utf8(neg ? s.substring(1) : s));
  return neg ? -n : n;
}

function badConfig(msg: string): void {
  logNow(LevelError, "window_count: bad config: " + msg);
  unreachable(); // the instance fails to start: the job stops before reading input
}

// configure reads the configuration when the instance starts.
function configure(): void {
  const cfg = str(config());
  const sizeField = jsonField(cfg, "size_ms");
  if (sizeField != null) {
    const n = <i64>parseU64(utf8(sizeField));
    if (n == -1) badConfig("size_ms " + sizeField);
    if (n > 0) size = n;
  }
  const timeField = jsonField(cfg, "time");
  if (timeField != null) {
    if (timeField == "\"processing\"") processing = true;
    else if (timeField != "\"event\"") badConfig("\"time\" is " + timeField + ", want \"event\" or \"processing\"");
  }
}

configure();

function floorDiv(a: i64, b: i64): i64 {
  let q = a / b;
  if (a % b != 0 && (a < 0) != (b < 0)) q--;
  return q;
}

function onRecord(c: Context, r: Record): bool {
  const start = floorDiv(processing ? c.procTime() : r.time, size) * size;
  const sub = start.toString();
  let n: u64 = 0;
  const v = c.get(sub);
  if (v) n = parseU64(v);
  c.put(sub, utf8((n + 1).toString()));
  if (processing) c.registerProcessingTimer(start + size - 1);
  else c.registerEventTimer(start + size - 1);
  return true;
}

function onTimer(c: Context, t: Timer): bool {
  if (t.processing != processing) return c.error("window_count: a timer of the other time domain");
  // Every window of the key that has ended by the timer's time (normally
  // just the one whose timer this is), oldest first: scan's order is the
  // sub-keys' (text), so sort by start.
  const windows = c.scan("");
  const starts: Array<i64> = [];
  const counts: Array<string> = [];
  for (let i = 0; i < windows.length; i++) {
    const start = parseI64(windows[i].sub);
    if (windows[i].sub.length == 0 || start + size - 1 > t.time) continue;
    let j = starts.length;
    starts.push(start);
    counts.push(str(windows[i].value));
    while (j > 0 && starts[j - 1] > start) {
      starts[j] = starts[j - 1];
      counts[j] = counts[j - 1];
      j--;
    }
    starts[j] = start;
    counts[j] = str(windows[i].value);
  }
  for (let i = 0; i < starts.length; i++) {
    c.emit(t.key, utf8(starts[i].toString() + "," + counts[i]), starts[i] + size - 1);
    c.delete(starts[i].toString());
  }
  return true;
}

register(onRecord, onTimer);
