//! The cairn operator SDK for Rust (ABI v1, docs/ABI.md): one file, no
//! dependencies beyond `std`, built with Debian's `rustc` and
//! `libstd-rust-dev-wasm32` (target `wasm32-wasi`, no cargo, no crates).
//!
//! Put this file next to your operator's `lib.rs`, declare it with
//! `#[macro_use] mod cairn;`, implement [`Operator`] and install it with
//! [`cairn_operator!`]:
//!
//! ```ignore
//! #[macro_use]
//! mod cairn;
//! use cairn::{Context, Operator, Record};
//!
//! struct Count;
//! impl Operator for Count {
//!     fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
//!         let n: u64 = match c.get(b"") {
//!             Some(v) => std::str::from_utf8(v)?.parse()?,
//!             None => 0,
//!         };
//!         let v = (n + 1).to_string();
//!         c.put(b"", v.as_bytes());
//!         c.emit(r.key, v.as_bytes(), r.time);
//!         Ok(())
//!     }
//! }
//! cairn_operator!(Count);
//! ```
//!
//! Build a reactor module (the SDK defines the exports):
//!
//! ```text
//! rustc --edition 2021 --crate-type cdylib --target wasm32-wasi -C opt-level=3 \
//!       -C strip=symbols -o op.wasm lib.rs
//! ```
//!
//! State is owned by the host: keep nothing you need across calls in the
//! operator's fields (instances are replaced after a failure and on
//! restore); read and write it through the [`Context`]. Slices handed to
//! the operator (record key and value, state values) borrow the call's
//! buffers: copy them to keep them. An `Err` from a callback fails the whole
//! call: the engine dead-letters the record with the error text. A panic
//! aborts the module (wasm32-wasi has no unwinding): the host names the
//! record from the progress word and uses the panic message as the reason.

#![allow(dead_code)]

use std::collections::BTreeMap;

/// An operator's error: anything that converts into it works with `?`
/// (a `String`, a `&str`, a parse error...).
pub type Error = Box<dyn std::error::Error>;

/// The result of a callback.
pub type Result<T = ()> = std::result::Result<T, Error>;

/// Log levels, with slog's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug = -4,
    Info = 0,
    Warn = 4,
    Error = 8,
}

/// An input record.
pub struct Record<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// Event time, Unix milliseconds.
    pub time: i64,
}

/// A fired timer of the current key.
pub struct Timer<'a> {
    pub key: &'a [u8],
    pub time: i64,
    /// A processing-time timer (else event time).
    pub processing: bool,
}

/// The callbacks of an operator. `on_timer` is needed only by keyed
/// operators that register timers.
pub trait Operator {
    fn on_record(&mut self, c: &mut Context, r: Record) -> Result;
    fn on_timer(&mut self, _c: &mut Context, _t: Timer) -> Result {
        Ok(())
    }
}

/// Installs the operator: `cairn_operator!(expr)` defines the module's
/// `_initialize`, which evaluates `expr` once per instance (it may read
/// [`config`] and panic on a bad one: the instance then fails to start).
#[macro_export]
macro_rules! cairn_operator {
    ($op:expr) => {
        #[no_mangle]
        pub extern "C" fn _initialize() {
            $crate::cairn::register(Box::new($op));
        }
    };
}

/// Installs `op` (see [`cairn_operator!`]).
pub fn register(op: Box<dyn Operator>) {
    unsafe { OP = Some(op) }
}

// --- host functions (module cairn_v1) ---------------------------------------

#[link(wasm_import_module = "cairn_v1")]
extern "C" {
    #[link_name = "state_get"]
    fn host_state_get(kp: *const u8, kl: u32, sp: *const u8, sl: u32, dp: *mut u8, dc: u32) -> i64;
    #[link_name = "state_scan"]
    fn host_state_scan(kp: *const u8, kl: u32, pp: *const u8, pl: u32, dp: *mut u8, dc: u32) -> i64;
    #[link_name = "log"]
    fn host_log(level: i32, p: *const u8, l: u32);
    #[link_name = "config"]
    fn host_config(dp: *mut u8, dc: u32) -> u32;
}

const VERSION: u8 = 1;
const STATE_ABSENT: i64 = -1;
const PROGRESS_IDLE: i32 = i32::MIN;
const TAG_EMIT: u8 = 1;
const TAG_STATE: u8 = 2;
const TAG_TIMER: u8 = 3;
const TAG_LOG: u8 = 4;
const TAG_ERROR: u8 = 5;

/// The operator's config (the stage's `config` from the job file, usually
/// JSON); empty when none. Callable from the operator's constructor.
pub fn config() -> &'static [u8] {
    unsafe {
        if CONFIG.is_none() {
            let mut buf = vec![0u8; 256];
            loop {
                let n = host_config(buf.as_mut_ptr(), buf.len() as u32) as usize;
                if n <= buf.len() {
                    buf.truncate(n);
                    break;
                }
                buf = vec![0u8; n];
            }
            CONFIG = Some(buf);
        }
        CONFIG.as_ref().unwrap()
    }
}

/// Logs a line right away (from the constructor, or before something that
/// may crash); inside a callback prefer [`Context::log`].
pub fn log(level: Level, msg: &str) {
    unsafe { host_log(level as i32, msg.as_ptr(), msg.len() as u32) }
}

// --- the call's state ---------------------------------------------------------

static mut OP: Option<Box<dyn Operator>> = None;
static mut CONFIG: Option<Vec<u8>> = None;
static mut PROGRESS: i32 = PROGRESS_IDLE;
static mut HOST_FAILED: bool = false;
static mut INPUT: Vec<u8> = Vec::new();
static mut RT: Runtime = Runtime {
    watermark: 0,
    proctime: 0,
    keys: Vec::new(),
    nkeys: 0,
    out: Vec::new(),
    get_buf: Vec::new(),
};

struct Runtime {
    watermark: i64,
    proctime: i64,
    keys: Vec<KeyState>, // reused across calls: only the first nkeys are this call's
    nkeys: usize,
    out: Vec<u8>,
    get_buf: Vec<u8>,
}

/// One key of the batch with the overlay of its state: sub-key "" (the
/// prefetched value, or a copy the operator put) and every other sub-key
/// read or written in the call.
struct KeyState {
    key: &'static [u8],
    known: bool,   // the value of "" below reflects the state
    present: bool, // it exists
    dirty: bool,   // written in this call
    in_input: Option<&'static [u8]>,
    owned: Vec<u8>,
    subs: Vec<SubState>,
}

struct SubState {
    sub: Vec<u8>,
    val: Option<Vec<u8>>,
    dirty: bool,
}

impl KeyState {
    fn value(&self) -> Option<&[u8]> {
        if !self.present {
            return None;
        }
        match self.in_input {
            Some(v) => Some(v),
            None => Some(&self.owned),
        }
    }
}

#[allow(clippy::mut_from_ref)]
fn rt() -> &'static mut Runtime {
    unsafe { &mut *std::ptr::addr_of_mut!(RT) }
}

/// The operator's view of the call while it handles one record or timer:
/// the current key's state, emits, timers, logs.
pub struct Context {
    key_idx: usize,
    src: i32,
}

fn fetch(get_buf: &mut Vec<u8>, key: &[u8], sub: &[u8]) -> Option<Vec<u8>> {
    if get_buf.len() < 4096 {
        get_buf.resize(4096, 0);
    }
    loop {
        let n = unsafe {
            host_state_get(key.as_ptr(), key.len() as u32, sub.as_ptr(), sub.len() as u32, get_buf.as_mut_ptr(), get_buf.len() as u32)
        };
        if n == STATE_ABSENT {
            return None;
        }
        if n < 0 {
            // The host failed: the call fails, and the host reports why.
            unsafe { HOST_FAILED = true };
            return None;
        }
        let n = n as usize;
        if n <= get_buf.len() {
            return Some(get_buf[..n].to_vec());
        }
        get_buf.resize(n, 0);
    }
}

impl Context {
    /// The current key.
    pub fn key(&self) -> &[u8] {
        rt().keys[self.key_idx].key
    }

    /// The stage's event-time watermark at the call (Unix ms; `i64::MIN`
    /// before the first).
    pub fn watermark(&self) -> i64 {
        rt().watermark
    }

    /// The stage's processing clock at the call (Unix ms): ingestion time,
    /// so a replay sees the same value at the same records.
    pub fn proc_time(&self) -> i64 {
        rt().proctime
    }

    /// The operator's config (see [`config`]).
    pub fn config(&self) -> &'static [u8] {
        config()
    }

    /// The value of sub-key `sub` of the current key's state, this call's
    /// writes included. Sub-key `b""` is prefetched: no host call.
    pub fn get(&mut self, sub: &[u8]) -> Option<&[u8]> {
        let Runtime { keys, get_buf, .. } = rt();
        let k = &mut keys[self.key_idx];
        if sub.is_empty() {
            if !k.known {
                let v = fetch(get_buf, k.key, b"");
                k.known = true;
                k.present = v.is_some();
                k.in_input = None;
                k.owned = v.unwrap_or_default();
            }
            return k.value();
        }
        let i = match k.subs.iter().position(|s| s.sub == sub) {
            Some(i) => i,
            None => {
                let v = fetch(get_buf, k.key, sub);
                k.subs.push(SubState { sub: sub.to_vec(), val: v, dirty: false });
                k.subs.len() - 1
            }
        };
        k.subs[i].val.as_deref()
    }

    /// Sets sub-key `sub` of the current key's state to a copy of `v`.
    pub fn put(&mut self, sub: &[u8], v: &[u8]) {
        self.set(sub, Some(v))
    }

    /// Removes sub-key `sub` of the current key's state.
    pub fn delete(&mut self, sub: &[u8]) {
        self.set(sub, None)
    }

    fn set(&mut self, sub: &[u8], v: Option<&[u8]>) {
        let k = &mut rt().keys[self.key_idx];
        if sub.is_empty() {
            k.known = true;
            k.dirty = true;
            k.present = v.is_some();
            k.in_input = None;
            k.owned.clear();
            k.owned.extend_from_slice(v.unwrap_or_default());
            return;
        }
        let val = v.map(|v| v.to_vec());
        match k.subs.iter_mut().find(|s| s.sub == sub) {
            Some(s) => {
                s.val = val;
                s.dirty = true;
            }
            None => k.subs.push(SubState { sub: sub.to_vec(), val, dirty: true }),
        }
    }

    /// Every sub-key of the current key starting with `prefix`, with its
    /// value, in sub-key order, this call's writes included.
    pub fn scan(&mut self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let k = &rt().keys[self.key_idx];
        let mut buf = vec![0u8; 4096];
        loop {
            let n = unsafe {
                host_state_scan(k.key.as_ptr(), k.key.len() as u32, prefix.as_ptr(), prefix.len() as u32, buf.as_mut_ptr(), buf.len() as u32)
            };
            if n < 0 {
                unsafe { HOST_FAILED = true };
                return Vec::new();
            }
            let n = n as usize;
            if n <= buf.len() {
                buf.truncate(n);
                break;
            }
            buf = vec![0u8; n];
        }
        let mut m = BTreeMap::new();
        let mut r = Reader { b: &buf, off: 0 };
        while r.off < buf.len() {
            match (r.bytes(), r.bytes()) {
                (Ok(s), Ok(v)) => {
                    m.insert(s.to_vec(), v.to_vec());
                }
                _ => panic!("cairn: malformed state_scan result"),
            }
        }
        if prefix.is_empty() && k.dirty {
            match k.value() {
                Some(v) => m.insert(Vec::new(), v.to_vec()),
                None => m.remove(&b""[..]),
            };
        }
        for s in k.subs.iter().filter(|s| s.dirty && s.sub.starts_with(prefix)) {
            match &s.val {
                Some(v) => m.insert(s.sub.clone(), v.clone()),
                None => m.remove(&s.sub),
            };
        }
        m.into_iter().collect()
    }

    /// Outputs a record. Its key decides the partition (and, for a following
    /// keyed stage, the slot).
    pub fn emit(&mut self, key: &[u8], value: &[u8], time: i64) {
        let out = &mut rt().out;
        out.reserve(21 + key.len() + value.len());
        out.push(TAG_EMIT);
        out.extend_from_slice(&self.src.to_le_bytes());
        out.extend_from_slice(&time.to_le_bytes());
        put_bytes(out, key);
        put_bytes(out, value);
    }

    fn timer(&mut self, t: i64, processing: bool, delete: bool) {
        let out = &mut rt().out;
        out.push(TAG_TIMER);
        out.push(delete as u8 | (processing as u8) << 1);
        out.extend_from_slice(&(self.key_idx as u32).to_le_bytes());
        out.extend_from_slice(&t.to_le_bytes());
    }

    /// Asks for `on_timer` with this key once the watermark passes `t`.
    pub fn register_event_timer(&mut self, t: i64) {
        self.timer(t, false, false)
    }

    /// Cancels an event-time timer of the current key.
    pub fn delete_event_timer(&mut self, t: i64) {
        self.timer(t, false, true)
    }

    /// Asks for `on_timer` with this key once processing time passes `t`.
    pub fn register_processing_timer(&mut self, t: i64) {
        self.timer(t, true, false)
    }

    /// Cancels a processing-time timer of the current key.
    pub fn delete_processing_timer(&mut self, t: i64) {
        self.timer(t, true, true)
    }

    /// Logs a line through the host's logger when the call succeeds.
    pub fn log(&mut self, level: Level, msg: &str) {
        let out = &mut rt().out;
        out.push(TAG_LOG);
        out.extend_from_slice(&(level as i32).to_le_bytes());
        put_bytes(out, msg.as_bytes());
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

// --- the exports the host calls -----------------------------------------------

#[no_mangle]
pub extern "C" fn cairn_alloc(size: u32) -> *mut u8 {
    unsafe {
        INPUT = vec![0u8; size.max(1) as usize];
        INPUT.as_mut_ptr()
    }
}

#[no_mangle]
pub extern "C" fn cairn_progress() -> *mut i32 {
    unsafe { std::ptr::addr_of_mut!(PROGRESS) }
}

#[no_mangle]
pub extern "C" fn cairn_process(len: u32) -> u64 {
    let r = rt();
    unsafe { HOST_FAILED = false };
    r.out.clear();
    r.out.push(VERSION);
    let input: &'static [u8] = unsafe {
        let inp = &*std::ptr::addr_of!(INPUT);
        &inp[..(len as usize).min(inp.len())]
    };
    match run(input, len as usize) {
        Ok(()) => {
            let r = rt();
            for i in 0..r.nkeys {
                let k = &r.keys[i];
                if k.dirty {
                    state_op(&mut r.out, i, b"", k.value());
                }
                for s in k.subs.iter().filter(|s| s.dirty) {
                    state_op(&mut r.out, i, &s.sub, s.val.as_deref());
                }
            }
        }
        Err((src, msg)) => {
            let out = &mut rt().out;
            out.push(TAG_ERROR);
            out.extend_from_slice(&src.to_le_bytes());
            put_bytes(out, msg.as_bytes());
        }
    }
    unsafe { PROGRESS = PROGRESS_IDLE };
    let out = &rt().out;
    (out.as_ptr() as u64) << 32 | out.len() as u64
}

fn state_op(out: &mut Vec<u8>, key_idx: usize, sub: &[u8], v: Option<&[u8]>) {
    out.push(TAG_STATE);
    out.push(v.is_none() as u8);
    out.extend_from_slice(&(key_idx as u32).to_le_bytes());
    put_bytes(out, sub);
    put_bytes(out, v.unwrap_or_default());
}

struct Reader<'a> {
    b: &'a [u8],
    off: usize,
}

type Malformed = &'static str;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], Malformed> {
        if self.b.len() - self.off < n {
            return Err("truncated");
        }
        let s = &self.b[self.off..self.off + n];
        self.off += n;
        Ok(s)
    }
    fn u8(&mut self) -> std::result::Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> std::result::Result<u32, Malformed> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn i64(&mut self) -> std::result::Result<i64, Malformed> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(i64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> std::result::Result<&'a [u8], Malformed> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// Decodes the input (in place: keys and values borrow it) and runs the
/// callbacks for its timers, then its records.
fn run(input: &'static [u8], len: usize) -> std::result::Result<(), (i32, String)> {
    let malformed = |e: Malformed| (PROGRESS_IDLE, format!("sdk: malformed input: {}", e));
    if len > input.len() {
        return Err((PROGRESS_IDLE, "sdk: input longer than the allocated buffer".into()));
    }
    let op = match unsafe { (*std::ptr::addr_of_mut!(OP)).as_mut() } {
        Some(op) => op,
        None => return Err((PROGRESS_IDLE, "sdk: no operator registered (use cairn_operator!)".into())),
    };
    let mut r = Reader { b: input, off: 0 };
    if r.u8().map_err(malformed)? != VERSION {
        return Err(malformed("version"));
    }
    let st = rt(); // not held across the callbacks below
    st.watermark = r.i64().map_err(malformed)?;
    st.proctime = r.i64().map_err(malformed)?;
    let n = r.u32().map_err(malformed)? as usize;
    if n > (input.len() - r.off) / 5 {
        return Err(malformed("key count larger than the input"));
    }
    st.nkeys = n;
    for i in 0..n {
        if i == st.keys.len() {
            st.keys.push(KeyState { key: b"", known: false, present: false, dirty: false, in_input: None, owned: Vec::new(), subs: Vec::new() });
        }
        let fetch = r.u8().map_err(malformed)?;
        let k = &mut st.keys[i];
        k.key = r.bytes().map_err(malformed)?;
        k.known = fetch != 0;
        k.present = fetch == 2;
        k.dirty = false;
        k.in_input = None;
        k.owned.clear();
        k.subs.clear();
        match fetch {
            0 | 1 => {}
            2 => k.in_input = Some(r.bytes().map_err(malformed)?),
            _ => return Err(malformed("key fetch flag")),
        }
    }
    let n_timers = r.u32().map_err(malformed)? as usize;
    for t in 0..n_timers {
        let flags = r.u8().map_err(malformed)?;
        let ki = r.u32().map_err(malformed)? as usize;
        let time = r.i64().map_err(malformed)?;
        if flags & !1 != 0 || ki >= rt().nkeys {
            return Err(malformed("timer entry"));
        }
        let src = -(t as i32) - 1;
        unsafe { PROGRESS = src };
        let mut c = Context { key_idx: ki, src };
        let key = rt().keys[ki].key;
        op.on_timer(&mut c, Timer { key, time, processing: flags & 1 != 0 }).map_err(|e| (src, e.to_string()))?;
        if unsafe { HOST_FAILED } {
            return Err((src, "host failure".into()));
        }
    }
    let n_records = r.u32().map_err(malformed)? as usize;
    if n_records > (input.len() - r.off) / 16 {
        return Err(malformed("record count larger than the input"));
    }
    for i in 0..n_records {
        let ki = r.u32().map_err(malformed)? as usize;
        let time = r.i64().map_err(malformed)?;
        let value = r.bytes().map_err(malformed)?;
        if ki >= rt().nkeys {
            return Err(malformed("record key index"));
        }
        unsafe { PROGRESS = i as i32 };
        let mut c = Context { key_idx: ki, src: i as i32 };
        let key = rt().keys[ki].key;
        op.on_record(&mut c, Record { key, value, time }).map_err(|e| (i as i32, e.to_string()))?;
        if unsafe { HOST_FAILED } {
            return Err((i as i32, "host failure".into()));
        }
    }
    if r.off != len {
        return Err(malformed("trailing bytes"));
    }
    Ok(())
}

// --- state versions and migrations (docs/UPGRADES.md) ---------------------------
//
// The exports cairn_state_version and cairn_migrate exist only in modules
// that use the macros below, so a module that does not exports nothing
// more than before.

/// Declares the version of the shape of the state the module's operator
/// reads and writes (0, without the macro, is "none declared"): defines the
/// export `cairn_state_version`. A job refuses to restore state of another
/// version until it is migrated. A module with [`cairn_migration!`]
/// declares the migration's version instead (the macro would define the
/// export twice).
#[macro_export]
macro_rules! cairn_state_version {
    ($v:expr) => {
        #[no_mangle]
        pub extern "C" fn cairn_state_version() -> i32 {
            $v
        }
    };
}

/// Installs a migration: `cairn_migration!(to_version, expr)` defines the
/// exports `cairn_migrate` and `cairn_state_version` (returning
/// `to_version`: the state version of what the migration writes, which the
/// new operator reads). `expr`, a [`Migration`], is evaluated once per
/// instance, at its first migration call (it may read [`config`]: `cairn
/// state migrate --config`). A module may install both an operator and a
/// migration: the new version of an operator that migrates the old
/// version's state. Run it with `cairn state migrate --with MODULE.wasm`.
#[macro_export]
macro_rules! cairn_migration {
    ($to:expr, $m:expr) => {
        cairn_state_version!($to);
        #[no_mangle]
        pub extern "C" fn cairn_migrate(len: u32) -> u64 {
            $crate::cairn::migrate_call(len, &mut || Box::new($m))
        }
    };
}

/// One entry of a stage's state, as a migration sees and writes it: a
/// value of (`key`, `sub`), or a timer of `key`. Its slices borrow the
/// call's buffers (or yours): valid until `migrate` returns.
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry<'a> {
    /// A timer (`time`, `processing`) rather than a value (`sub`, `value`,
    /// `has_expiry`, `expiry`).
    pub timer: bool,
    pub key: &'a [u8],
    pub sub: &'a [u8],
    pub value: &'a [u8],
    /// A value's TTL (Unix ms): a value written by a stage with a TTL
    /// expires then; a migration keeps, changes or drops it.
    pub has_expiry: bool,
    pub expiry: i64,
    /// A timer's time (Unix ms), and whether it is a processing-time timer
    /// (else event time).
    pub time: i64,
    pub processing: bool,
}

/// Converts a stage's state from one shape to another. `migrate` is called
/// once per entry of the stage's old state, key group by key group, and
/// writes the new state with [`Migrator::put`]: any number of entries (none
/// drops the entry). The entries it writes keep the key of the entry they
/// came from, or another key of the same key group: re-keying goes through
/// `cairn state export` and `import`. An `Err` fails the whole migration,
/// naming the key; so does a panic. Keep nothing across calls.
pub trait Migration {
    fn migrate(&mut self, m: &mut Migrator, e: Entry) -> Result;
}

/// Writes the new state of one call.
pub struct Migrator {
    src: i32,
}

const MIGRATE_VERSION: u8 = 1;
const ENTRY_VALUE: u8 = 1;
const ENTRY_TIMER: u8 = 2;
const FLAG_EXPIRY: u8 = 1;
const FLAG_PROCESSING: u8 = 2;
const MIGRATE_TAG_ENTRY: u8 = 1;

impl Migrator {
    /// Writes an entry of the new state (copied).
    pub fn put(&mut self, e: &Entry) {
        let (kind, flags, sub, value, when): (u8, u8, &[u8], &[u8], i64) = if e.timer {
            (ENTRY_TIMER, if e.processing { FLAG_PROCESSING } else { 0 }, b"", b"", e.time)
        } else if e.has_expiry {
            (ENTRY_VALUE, FLAG_EXPIRY, e.sub, e.value, e.expiry)
        } else {
            (ENTRY_VALUE, 0, e.sub, e.value, 0)
        };
        let out = &mut rt().out;
        out.reserve(27 + e.key.len() + sub.len() + value.len());
        out.push(MIGRATE_TAG_ENTRY);
        out.extend_from_slice(&self.src.to_le_bytes());
        out.push(kind);
        out.push(flags);
        put_bytes(out, e.key);
        put_bytes(out, sub);
        out.extend_from_slice(&when.to_le_bytes());
        put_bytes(out, value);
    }
}

static mut MIGRATION: Option<Box<dyn Migration>> = None;

/// The body of `cairn_migrate` (see [`cairn_migration!`]): migrates the
/// entries of the migrate input of `len` bytes in the input buffer.
pub fn migrate_call(len: u32, make: &mut dyn FnMut() -> Box<dyn Migration>) -> u64 {
    {
        let out = &mut rt().out;
        out.clear();
        out.push(MIGRATE_VERSION);
    }
    let input: &'static [u8] = unsafe { &*std::ptr::addr_of!(INPUT) };
    let res = if len as usize > input.len() {
        Err((-1, "sdk: input longer than the allocated buffer".to_string()))
    } else {
        let m = unsafe { (*std::ptr::addr_of_mut!(MIGRATION)).get_or_insert_with(|| make()) };
        migrate_run(m.as_mut(), &input[..len as usize])
    };
    unsafe { PROGRESS = PROGRESS_IDLE };
    let out = &mut rt().out;
    if let Err((src, msg)) = res {
        out.truncate(1); // only the error entry counts
        out.push(TAG_ERROR);
        out.extend_from_slice(&src.to_le_bytes());
        put_bytes(out, msg.as_bytes());
    }
    (out.as_ptr() as u64) << 32 | out.len() as u64
}

fn migrate_run(m: &mut dyn Migration, input: &[u8]) -> std::result::Result<(), (i32, String)> {
    let malformed = |e: Malformed| (-1, format!("sdk: malformed migrate input: {}", e));
    let mut r = Reader { b: input, off: 0 };
    if r.u8().map_err(malformed)? != MIGRATE_VERSION {
        return Err(malformed("version"));
    }
    let n = r.u32().map_err(malformed)? as usize;
    if n > (input.len() - r.off) / 22 {
        return Err(malformed("entry count larger than the input"));
    }
    for i in 0..n {
        let kind = r.u8().map_err(malformed)?;
        let flags = r.u8().map_err(malformed)?;
        let key = r.bytes().map_err(malformed)?;
        let sub = r.bytes().map_err(malformed)?;
        let when = r.i64().map_err(malformed)?;
        let value = r.bytes().map_err(malformed)?;
        let e = match kind {
            ENTRY_VALUE => Entry { key, sub, value, has_expiry: flags & FLAG_EXPIRY != 0, expiry: if flags & FLAG_EXPIRY != 0 { when } else { 0 }, ..Entry::default() },
            ENTRY_TIMER => Entry { timer: true, key, time: when, processing: flags & FLAG_PROCESSING != 0, ..Entry::default() },
            _ => return Err(malformed("entry kind")),
        };
        // The progress word names the entry if the migration panics.
        unsafe { PROGRESS = i as i32 };
        m.migrate(&mut Migrator { src: i as i32 }, e).map_err(|err| (i as i32, err.to_string()))?;
    }
    if r.off != input.len() {
        return Err(malformed("trailing bytes"));
    }
    Ok(())
}
