// cairn.ts: the cairn operator SDK for AssemblyScript (ABI v1,
// docs/ABI.md). One file, no dependencies; built with the `assemblyscript`
// npm package (asc 0.28):
//
//   asc op.ts --outFile op.wasm --optimize --exportStart _initialize \
//       --runtime minimal --use abort=cairn-sdk/cairn/cairnAbort
//
// (--runtime minimal: the SDK collects garbage once per call, at its
// start; about a quarter faster than the incremental collector.)
//
// An operator registers its callbacks at the top level of its entry file
// and re-exports the SDK's exports:
//
//   import { Context, Record, register, parseU64 } from "./cairn-sdk/cairn";
//   export { cairn_alloc, cairn_process, cairn_progress } from "./cairn-sdk/cairn";
//
//   function onRecord(c: Context, r: Record): bool {
//     const v = c.get("");                 // the key's state, sub-key ""
//     const n: u64 = v ? parseU64(v) : 0;
//     const out = utf8((n + 1).toString());
//     c.put("", out);                      // copied; visible to later gets
//     c.emit(r.key, out, r.time);          // (key, value, event time)
//     return true;                         // or: return c.error("why");
//   }
//   register(onRecord);
//
// State is owned by the host: keep nothing you need across calls in module
// globals (instances are replaced after a failure and on restore). Byte
// arrays handed to the operator (record key and value, state values) are
// views of the call's buffers: copy them (slice()) to keep them. A callback
// that returns false (c.error) fails the whole call: the engine dead-letters
// the record with the message. An abort (a failed assertion, an exception)
// traps, named by the progress word, with its message logged.

// --- host functions (module cairn_v1) ---

@external("cairn_v1", "state_get")
declare function hostStateGet(k: usize, kl: u32, s: usize, sl: u32, d: usize, dc: u32): i64;
@external("cairn_v1", "state_scan")
declare function hostStateScan(k: usize, kl: u32, p: usize, pl: u32, d: usize, dc: u32): i64;
@external("cairn_v1", "log")
declare function hostLog(level: i32, p: usize, l: u32): void;
@external("cairn_v1", "config")
declare function hostConfig(d: usize, dc: u32): u32;

const VERSION: u8 = 1;
const PROGRESS_IDLE: i32 = i32.MIN_VALUE;
const TAG_EMIT: u8 = 1;
const TAG_STATE: u8 = 2;
const TAG_TIMER: u8 = 3;
const TAG_LOG: u8 = 4;
const TAG_ERROR: u8 = 5;

/** Log levels, with slog's numbering. */
export const LevelDebug: i32 = -4;
export const LevelInfo: i32 = 0;
export const LevelWarn: i32 = 4;
export const LevelError: i32 = 8;

/** An input record; time is the event time in Unix milliseconds. */
export class Record {
  constructor(public key: Uint8Array, public value: Uint8Array, public time: i64) {}
}

/** A fired timer of the current key. */
export class Timer {
  constructor(public key: Uint8Array, public time: i64, public processing: bool) {}
}

/** A sub-key and its value, as scan returns them. */
export class Entry {
  constructor(public sub: string, public value: Uint8Array) {}
}

export type RecordFn = (c: Context, r: Record) => bool;
export type TimerFn = (c: Context, t: Timer) => bool;

function noTimer(c: Context, t: Timer): bool {
  return true;
}

let onRecord: RecordFn | null = null;
let onTimer: TimerFn = noTimer;

/** register installs the operator's callbacks; call it at the top level of
 * the entry file (which runs in _initialize). */
export function register(record: RecordFn, timer: TimerFn = noTimer): void {
  onRecord = record;
  onTimer = timer;
}

/** utf8 encodes a string as UTF-8 bytes. */
export function utf8(s: string): Uint8Array {
  return Uint8Array.wrap(String.UTF8.encode(s));
}

/** str decodes UTF-8 bytes. */
export function str(b: Uint8Array): string {
  return String.UTF8.decodeUnsafe(b.dataStart, <usize>b.length);
}

/** parseU64 parses decimal ASCII (no sign); -1 as u64 when it is not. */
export function parseU64(b: Uint8Array): u64 {
  if (b.length == 0 || b.length > 19) return u64.MAX_VALUE;
  let n: u64 = 0;
  for (let i = 0; i < b.length; i++) {
    const d = <u32>b[i] - 48;
    if (d > 9) return u64.MAX_VALUE;
    n = n * 10 + d;
  }
  return n;
}

// --- the call's state ---

const PROGRESS: usize = memory.data(4);
store<i32>(PROGRESS, PROGRESS_IDLE);

let inBuf: ArrayBuffer = new ArrayBuffer(0);
let inWatermark: i64 = 0;
let inProctime: i64 = 0;
let out: usize = 0;
let outLen: usize = 0;
let outCap: usize = 0;
let hostFailed = false;
let errMsg: string | null = null;
let configBytes: Uint8Array | null = null;

class KeyState {
  key: Uint8Array = new Uint8Array(0);
  known: bool = false;
  present: bool = false;
  dirty: bool = false;
  val: Uint8Array = new Uint8Array(0);
  subs: Array<SubState> = [];
}

class SubState {
  constructor(public sub: Uint8Array, public val: Uint8Array | null, public dirty: bool) {}
}

let keys: Array<KeyState> = [];
let nKeys: i32 = 0;
// The context and record handed to the callbacks, reused: callbacks must
// not keep them.
const ctx = new Context(0, 0);
const record = new Record(new Uint8Array(0), new Uint8Array(0), 0);

function sameBytes(a: Uint8Array, b: Uint8Array): bool {
  return a.length == b.length && memory.compare(a.dataStart, b.dataStart, <usize>a.length) == 0;
}

function compareBytes(a: Uint8Array, b: Uint8Array): i32 {
  const n = min(a.length, b.length);
  const r = n > 0 ? memory.compare(a.dataStart, b.dataStart, <usize>n) : 0;
  if (r != 0) return r;
  return a.length - b.length;
}

function reserve(n: usize): usize {
  if (outLen + n > outCap) {
    let c = outCap > 0 ? outCap : 4096;
    while (c < outLen + n) c *= 2;
    out = out == 0 ? heap.alloc(c) : heap.realloc(out, c);
    outCap = c;
  }
  const p = out + outLen;
  outLen += n;
  return p;
}

function putBytes(p: usize, ptr: usize, n: usize): usize {
  store<u32>(p, <u32>n);
  memory.copy(p + 4, ptr, n);
  return p + 4 + n;
}

function fetch(key: Uint8Array, sub: Uint8Array): Uint8Array | null {
  let buf = new Uint8Array(4096);
  let n = hostStateGet(key.dataStart, key.length, sub.dataStart, sub.length, buf.dataStart, buf.length);
  if (n > <i64>buf.length) {
    buf = new Uint8Array(<i32>n);
    n = hostStateGet(key.dataStart, key.length, sub.dataStart, sub.length, buf.dataStart, buf.length);
  }
  if (n == -1) return null;
  if (n < 0 || n > <i64>buf.length) {
    hostFailed = true; // the call fails; the host reports why
    return null;
  }
  return buf.slice(0, <i32>n);
}

/** config returns the operator's config (the stage's config from the job
 * file); callable at the top level too. */
export function config(): Uint8Array {
  let c = configBytes;
  if (c == null) {
    let buf = new Uint8Array(256);
    for (;;) {
      const n = hostConfig(buf.dataStart, buf.length);
      if (n <= <u32>buf.length) {
        c = buf.slice(0, <i32>n);
        break;
      }
      buf = new Uint8Array(<i32>n);
    }
    configBytes = c;
  }
  return c!;
}

/** logNow logs a line right away (at the top level, or before something
 * that may abort); in a callback prefer Context.log. */
export function logNow(level: i32, msg: string): void {
  const b = utf8(msg);
  hostLog(level, b.dataStart, b.length);
}

/** The operator's view of the call while it handles one record or timer. */
export class Context {
  constructor(public keyIdx: i32, public src: i32) {}

  /** The current key. */
  key(): Uint8Array {
    return keys[this.keyIdx].key;
  }
  /** The watermark at the call (Unix ms; i64.MIN_VALUE before the first). */
  watermark(): i64 {
    return inWatermark;
  }
  /** The stage's processing clock at the call (Unix ms; ingestion time). */
  procTime(): i64 {
    return inProctime;
  }
  config(): Uint8Array {
    return config();
  }

  /** The value of sub-key sub of the current key's state, this call's
   * writes included; null when absent. Sub-key "" is prefetched. */
  get(sub: string): Uint8Array | null {
    const k = keys[this.keyIdx];
    if (sub.length == 0) {
      if (!k.known) {
        const v = fetch(k.key, new Uint8Array(0));
        k.known = true;
        k.present = v != null;
        if (v) k.val = v;
      }
      return k.present ? k.val : null;
    }
    const s = utf8(sub);
    for (let i = 0; i < k.subs.length; i++) {
      if (sameBytes(k.subs[i].sub, s)) return k.subs[i].val;
    }
    const v = fetch(k.key, s);
    k.subs.push(new SubState(s, v, false));
    return v;
  }

  /** put sets sub-key sub of the current key's state to a copy of v. */
  put(sub: string, v: Uint8Array): void {
    this.set(sub, v.slice());
  }

  /** delete removes sub-key sub of the current key's state. */
  delete(sub: string): void {
    this.set(sub, null);
  }

  private set(sub: string, v: Uint8Array | null): void {
    const k = keys[this.keyIdx];
    if (sub.length == 0) {
      k.known = true;
      k.dirty = true;
      k.present = v != null;
      k.val = v ? v : new Uint8Array(0);
      return;
    }
    const s = utf8(sub);
    for (let i = 0; i < k.subs.length; i++) {
      if (sameBytes(k.subs[i].sub, s)) {
        k.subs[i].val = v;
        k.subs[i].dirty = true;
        return;
      }
    }
    k.subs.push(new SubState(s, v, true));
  }

  /** scan returns every sub-key of the current key starting with prefix,
   * with its value, in sub-key (UTF-8 byte) order, this call's writes
   * included. */
  scan(prefix: string): Array<Entry> {
    const k = keys[this.keyIdx];
    const p = utf8(prefix);
    let buf = new Uint8Array(4096);
    let n: i64 = 0;
    for (;;) {
      n = hostStateScan(k.key.dataStart, k.key.length, p.dataStart, p.length, buf.dataStart, buf.length);
      if (n < 0) {
        hostFailed = true;
        return [];
      }
      if (n <= <i64>buf.length) break;
      buf = new Uint8Array(<i32>n);
    }
    const subs: Array<Uint8Array> = [];
    const vals: Array<Uint8Array | null> = [];
    let off = 0;
    while (off < <i32>n) {
      const sl = <i32>load<u32>(buf.dataStart + off);
      const s = buf.subarray(off + 4, off + 4 + sl);
      off += 4 + sl;
      const vl = <i32>load<u32>(buf.dataStart + off);
      const v = buf.subarray(off + 4, off + 4 + vl);
      off += 4 + vl;
      subs.push(s);
      vals.push(v);
    }
    if (k.dirty && p.length == 0) overlay(subs, vals, new Uint8Array(0), k.present ? k.val : null);
    for (let i = 0; i < k.subs.length; i++) {
      const s = k.subs[i];
      if (s.dirty && s.sub.length >= p.length && memory.compare(s.sub.dataStart, p.dataStart, <usize>p.length) == 0) {
        overlay(subs, vals, s.sub, s.val);
      }
    }
    // Insertion sort by sub-key: scans are short.
    const order: Array<i32> = [];
    for (let i = 0; i < subs.length; i++) {
      if (vals[i] == null) continue;
      let j = order.length;
      order.push(i);
      while (j > 0 && compareBytes(subs[order[j - 1]], subs[i]) > 0) {
        order[j] = order[j - 1];
        j--;
      }
      order[j] = i;
    }
    const res: Array<Entry> = [];
    for (let i = 0; i < order.length; i++) res.push(new Entry(str(subs[order[i]]), vals[order[i]]!));
    return res;
  }

  /** emit outputs a record (copied). Its key decides the partition. */
  emit(key: Uint8Array, value: Uint8Array, time: i64): void {
    const p = reserve(21 + <usize>key.length + <usize>value.length);
    store<u8>(p, TAG_EMIT);
    store<i32>(p + 1, this.src);
    store<i64>(p + 5, time);
    putBytes(putBytes(p + 13, key.dataStart, key.length), value.dataStart, value.length);
  }

  private timer(t: i64, processing: bool, del: bool): void {
    const p = reserve(14);
    store<u8>(p, TAG_TIMER);
    store<u8>(p + 1, (del ? 1 : 0) | (processing ? 2 : 0));
    store<u32>(p + 2, this.keyIdx);
    store<i64>(p + 6, t);
  }
  /** on the timer callback once the watermark passes t. */
  registerEventTimer(t: i64): void {
    this.timer(t, false, false);
  }
  deleteEventTimer(t: i64): void {
    this.timer(t, false, true);
  }
  /** on the timer callback once the processing clock passes t. */
  registerProcessingTimer(t: i64): void {
    this.timer(t, true, false);
  }
  deleteProcessingTimer(t: i64): void {
    this.timer(t, true, true);
  }

  /** log logs a line through the host's logger when the call succeeds. */
  log(level: i32, msg: string): void {
    const b = utf8(msg);
    const p = reserve(9 + <usize>b.length);
    store<u8>(p, TAG_LOG);
    store<i32>(p + 1, level);
    putBytes(p + 5, b.dataStart, b.length);
  }

  /** error sets the message of the call's failure and returns false:
   * `return c.error("bad value");` */
  error(msg: string): bool {
    errMsg = msg;
    return false;
  }
}

function overlay(subs: Array<Uint8Array>, vals: Array<Uint8Array | null>, sub: Uint8Array, val: Uint8Array | null): void {
  for (let i = 0; i < subs.length; i++) {
    if (sameBytes(subs[i], sub)) {
      vals[i] = val;
      return;
    }
  }
  subs.push(sub);
  vals.push(val);
}

/** cairnAbort is the module's abort (asc --use abort=...): it logs the
 * message and traps, so the host names the record and dead-letters it. */
export function cairnAbort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  let m = message ? message : "abort";
  if (fileName) m += " at " + fileName + ":" + line.toString() + ":" + column.toString();
  logNow(LevelError, m);
  unreachable();
}

// --- the exports the host calls ---

export function cairn_alloc(size: u32): usize {
  inBuf = new ArrayBuffer(<i32>max(size, 1));
  return changetype<usize>(inBuf);
}

export function cairn_progress(): usize {
  return PROGRESS;
}

export function cairn_process(len: u32): u64 {
  // Collect the previous calls' garbage once per call: with asc --runtime
  // minimal this is the only collection (nothing of a call is live after
  // it but the SDK's globals).
  __collect();
  outLen = 0;
  store<u8>(reserve(1), VERSION);
  hostFailed = false;
  errMsg = null;
  let src: i32 = PROGRESS_IDLE;
  let err: string | null = null;
  if (len > <u32>inBuf.byteLength) {
    err = "sdk: input longer than the allocated buffer";
  } else if (onRecord == null) {
    err = "sdk: no operator registered (call register)";
  } else {
    err = run(len);
    src = load<i32>(PROGRESS);
  }
  store<i32>(PROGRESS, PROGRESS_IDLE);
  if (err != null) {
    outLen = 1; // only the error entry counts
    const b = utf8(err);
    const p = reserve(9 + <usize>b.length);
    store<u8>(p, TAG_ERROR);
    store<i32>(p + 1, src);
    putBytes(p + 5, b.dataStart, b.length);
  } else {
    for (let i = 0; i < nKeys; i++) {
      const k = keys[i];
      if (k.dirty) stateOp(i, new Uint8Array(0), k.present ? k.val : null);
      for (let j = 0; j < k.subs.length; j++) {
        if (k.subs[j].dirty) stateOp(i, k.subs[j].sub, k.subs[j].val);
      }
    }
  }
  return (<u64>out << 32) | <u64>outLen;
}

function stateOp(keyIdx: i32, sub: Uint8Array, v: Uint8Array | null): void {
  const vl: usize = v ? <usize>v.length : 0;
  const p = reserve(14 + <usize>sub.length + vl);
  store<u8>(p, TAG_STATE);
  store<u8>(p + 1, v ? 0 : 1);
  store<u32>(p + 2, keyIdx);
  const q = putBytes(p + 6, sub.dataStart, sub.length);
  if (v) putBytes(q, v.dataStart, vl);
  else store<u32>(q, 0);
}

/** run decodes the input and runs the callbacks for its timers, then its
 * records; the progress word holds the source when it fails. */
function run(len: u32): string | null {
  const base = changetype<usize>(inBuf);
  const end = base + len;
  let p = base;
  if (len < 21 || load<u8>(p) != VERSION) return "sdk: malformed input: header";
  inWatermark = load<i64>(p + 1);
  inProctime = load<i64>(p + 9);
  const n = <i32>load<u32>(p + 17);
  p += 21;
  if (<usize>n > (end - p) / 5) return "sdk: malformed input: key count larger than the input";
  while (keys.length < n) keys.push(new KeyState());
  nKeys = n;
  for (let i = 0; i < n; i++) {
    if (end - p < 5) return "sdk: malformed input: truncated";
    const k = keys[i];
    const f = load<u8>(p);
    const kl = load<u32>(p + 1);
    p += 5;
    if (<usize>kl > end - p) return "sdk: malformed input: truncated";
    k.key = Uint8Array.wrap(inBuf, <i32>(p - base), <i32>kl);
    p += kl;
    k.known = f != 0;
    k.present = f == 2;
    k.dirty = false;
    k.subs = [];
    if (f == 2) {
      if (end - p < 4) return "sdk: malformed input: truncated";
      const vl = load<u32>(p);
      p += 4;
      if (<usize>vl > end - p) return "sdk: malformed input: truncated";
      k.val = Uint8Array.wrap(inBuf, <i32>(p - base), <i32>vl);
      p += vl;
    } else if (f > 2) {
      return "sdk: malformed input: key fetch flag";
    }
  }
  if (end - p < 4) return "sdk: malformed input: truncated";
  const nt = <i32>load<u32>(p);
  p += 4;
  if (<usize>nt > (end - p) / 13) return "sdk: malformed input: timer count larger than the input";
  for (let i = 0; i < nt; i++, p += 13) {
    const fl = load<u8>(p);
    const ki = <i32>load<u32>(p + 1);
    if ((fl & ~1) != 0 || ki < 0 || ki >= nKeys) return "sdk: malformed input: timer entry";
    store<i32>(PROGRESS, -i - 1);
    ctx.keyIdx = ki;
    ctx.src = -i - 1;
    const ok = onTimer(ctx, new Timer(keys[ki].key, load<i64>(p + 5), (fl & 1) != 0));
    if (!ok) return errMsg != null ? errMsg : "the timer callback failed";
    if (hostFailed) return "host failure";
  }
  store<i32>(PROGRESS, PROGRESS_IDLE);
  if (end - p < 4) return "sdk: malformed input: truncated";
  const nr = <i32>load<u32>(p);
  p += 4;
  if (<usize>nr > (end - p) / 16) return "sdk: malformed input: record count larger than the input";
  const rec = onRecord!;
  for (let i = 0; i < nr; i++) {
    if (end - p < 16) return "sdk: malformed input: truncated";
    const ki = <i32>load<u32>(p);
    const t = load<i64>(p + 4);
    const vl = load<u32>(p + 12);
    p += 16;
    if (<usize>vl > end - p) return "sdk: malformed input: truncated";
    if (ki < 0 || ki >= nKeys) return "sdk: malformed input: record key index";
    const v = Uint8Array.wrap(inBuf, <i32>(p - base), <i32>vl);
    p += vl;
    store<i32>(PROGRESS, i);
    ctx.keyIdx = ki;
    ctx.src = i;
    record.key = keys[ki].key;
    record.value = v;
    record.time = t;
    if (!rec(ctx, record)) return errMsg != null ? errMsg : "the record callback failed";
    if (hostFailed) return "host failure";
  }
  store<i32>(PROGRESS, PROGRESS_IDLE);
  if (p != end) return "sdk: malformed input: trailing bytes";
  return null;
}

// --- state versions and migrations (docs/UPGRADES.md) ---
//
// A module declares the version of its state (stateVersion), and a
// migration converts a stage's state from an older version
// (registerMigration), offline, with `cairn state migrate --with
// MODULE.wasm`. The exports cairn_state_version and cairn_migrate are the
// module's only when its entry file re-exports them, so a module that does
// not use them exports nothing more than before:
//
//   export { cairn_alloc, cairn_process, cairn_progress, cairn_state_version, cairn_migrate } from "./cairn-sdk/cairn";

const MIGRATE_VERSION: u8 = 1;
const ENTRY_VALUE: u8 = 1;
const ENTRY_TIMER: u8 = 2;
const FLAG_EXPIRY: u8 = 1;
const FLAG_PROCESSING: u8 = 2;
const MIGRATE_TAG_ENTRY: u8 = 1;
// The smallest encoded entry: u8 kind, u8 flags, u32 key, u32 sub, i64 when, u32 value.
const ENTRY_SIZE: usize = 22;

/** One entry of a stage's state, as a migration sees and writes it: a
 * value of (key, sub), or a timer of key. Its arrays are views of the
 * call's buffers, valid until the migration returns; the entry itself is
 * reused. */
export class MigrateEntry {
  /** A timer (time, processing) rather than a value (sub, value,
   * hasExpiry, expiry). */
  timer: bool = false;
  key: Uint8Array = new Uint8Array(0);
  sub: Uint8Array = new Uint8Array(0);
  value: Uint8Array = new Uint8Array(0);
  /** A value's TTL (Unix ms): a value written by a stage with a TTL
   * expires then; a migration keeps, changes or drops it. */
  hasExpiry: bool = false;
  expiry: i64 = 0;
  /** A timer's time (Unix ms) and domain (else event time). */
  time: i64 = 0;
  processing: bool = false;
}

/** Writes the new state of one call. */
export class Migrator {
  src: i32 = 0;

  /** put writes an entry of the new state (copied). */
  put(e: MigrateEntry): void {
    let kind = ENTRY_VALUE;
    let flags: u8 = 0;
    let when: i64 = 0;
    let sub = e.sub;
    let value = e.value;
    if (e.timer) {
      kind = ENTRY_TIMER;
      flags = e.processing ? FLAG_PROCESSING : 0;
      when = e.time;
      sub = EMPTY;
      value = EMPTY;
    } else if (e.hasExpiry) {
      flags = FLAG_EXPIRY;
      when = e.expiry;
    }
    const p = reserve(27 + <usize>e.key.length + <usize>sub.length + <usize>value.length);
    store<u8>(p, MIGRATE_TAG_ENTRY);
    store<i32>(p + 1, this.src);
    store<u8>(p + 5, kind);
    store<u8>(p + 6, flags);
    const q = putBytes(putBytes(p + 7, e.key.dataStart, e.key.length), sub.dataStart, sub.length);
    store<i64>(q, when);
    putBytes(q + 8, value.dataStart, value.length);
  }

  /** error sets the message of the call's failure and returns false:
   * `return m.error("why");` stops the whole migration, naming the key. */
  error(msg: string): bool {
    errMsg = msg;
    return false;
  }
}

/** A migration: called once per entry of the stage's old state, key group
 * by key group; it writes the new state with Migrator.put (any number of
 * entries, none drops the entry) and returns true, or false to fail (see
 * Migrator.error). The entries it writes keep the key of the entry they
 * came from, or another key of the same key group: re-keying goes through
 * `cairn state export` and `import`. Keep nothing across calls. */
export type MigrateFn = (m: Migrator, e: MigrateEntry) => bool;

const EMPTY = new Uint8Array(0);
let declaredVersion: i32 = 0;
let versionDeclared = false;
let migrationVersion: i32 = 0;
let migration: MigrateFn | null = null;
const migrator = new Migrator();
const migrateEntry = new MigrateEntry();

/** stateVersion declares the version of the shape of the state the
 * module's operator reads and writes (0, the default, is "none declared");
 * call it at the top level of the entry file. A job refuses to restore
 * state of another version until it is migrated. */
export function stateVersion(v: i32): void {
  declaredVersion = v;
  versionDeclared = true;
}

/** registerMigration installs a migration; toVersion is the state version
 * of what it writes (the new operator's). Unless stateVersion was called,
 * the module declares toVersion. A module may register both an operator
 * and a migration: the new version of an operator that migrates the old
 * version's state. Call it at the top level of the entry file. */
export function registerMigration(toVersion: i32, fn: MigrateFn): void {
  migrationVersion = toVersion;
  migration = fn;
}

export function cairn_state_version(): i32 {
  return versionDeclared ? declaredVersion : migrationVersion;
}

export function cairn_migrate(len: u32): u64 {
  __collect();
  outLen = 0;
  store<u8>(reserve(1), MIGRATE_VERSION);
  errMsg = null;
  let err: string | null = null;
  if (len > <u32>inBuf.byteLength) {
    err = "sdk: input longer than the allocated buffer";
  } else if (migration == null) {
    err = "sdk: no migration registered (call registerMigration)";
  } else {
    err = migrateRun(len);
  }
  const src = load<i32>(PROGRESS);
  store<i32>(PROGRESS, PROGRESS_IDLE);
  if (err != null) {
    outLen = 1; // only the error entry counts
    const b = utf8(err);
    const p = reserve(9 + <usize>b.length);
    store<u8>(p, TAG_ERROR);
    store<i32>(p + 1, src == PROGRESS_IDLE ? -1 : src);
    putBytes(p + 5, b.dataStart, b.length);
  }
  return (<u64>out << 32) | <u64>outLen;
}

/** migrateRun decodes a migrate input and calls the migration per entry;
 * the progress word holds the entry when it fails (PROGRESS_IDLE: the
 * input's fault). */
function migrateRun(len: u32): string | null {
  const base = changetype<usize>(inBuf);
  const end = base + len;
  let p = base;
  if (len < 5 || load<u8>(p) != MIGRATE_VERSION) return "sdk: malformed migrate input: header";
  const n = <i32>load<u32>(p + 1);
  p += 5;
  if (<usize>n > (end - p) / ENTRY_SIZE) return "sdk: malformed migrate input: entry count larger than the input";
  const fn = migration!;
  const e = migrateEntry;
  for (let i = 0; i < n; i++) {
    store<i32>(PROGRESS, PROGRESS_IDLE);
    if (end - p < 6) return "sdk: malformed migrate input: truncated";
    const kind = load<u8>(p);
    const flags = load<u8>(p + 1);
    const kl = load<u32>(p + 2);
    p += 6;
    if (<usize>kl > end - p) return "sdk: malformed migrate input: truncated";
    e.key = Uint8Array.wrap(inBuf, <i32>(p - base), <i32>kl);
    p += kl;
    if (end - p < 4) return "sdk: malformed migrate input: truncated";
    const sl = load<u32>(p);
    p += 4;
    if (<usize>sl > end - p) return "sdk: malformed migrate input: truncated";
    e.sub = Uint8Array.wrap(inBuf, <i32>(p - base), <i32>sl);
    p += sl;
    if (end - p < 12) return "sdk: malformed migrate input: truncated";
    const when = load<i64>(p);
    const vl = load<u32>(p + 8);
    p += 12;
    if (<usize>vl > end - p) return "sdk: malformed migrate input: truncated";
    e.value = Uint8Array.wrap(inBuf, <i32>(p - base), <i32>vl);
    p += vl;
    e.timer = false;
    e.hasExpiry = false;
    e.expiry = 0;
    e.time = 0;
    e.processing = false;
    if (kind == ENTRY_TIMER) {
      e.timer = true;
      e.time = when;
      e.processing = (flags & FLAG_PROCESSING) != 0;
      e.sub = EMPTY;
      e.value = EMPTY;
    } else if (kind == ENTRY_VALUE) {
      e.hasExpiry = (flags & FLAG_EXPIRY) != 0;
      if (e.hasExpiry) e.expiry = when;
    } else {
      return "sdk: malformed migrate input: entry kind";
    }
    // The progress word names the entry if the migration aborts.
    store<i32>(PROGRESS, i);
    migrator.src = i;
    if (!fn(migrator, e)) return errMsg != null ? errMsg : "the migration failed";
  }
  store<i32>(PROGRESS, PROGRESS_IDLE);
  if (p != end) return "sdk: malformed migrate input: trailing bytes";
  return null;
}
