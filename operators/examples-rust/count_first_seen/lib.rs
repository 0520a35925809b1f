//! count_first_seen is version 2 of the word count's keyed stage: it keeps,
//! per key, the count and the event time the key was first seen, as
//! "count,first_seen" (decimal ASCII), and emits that. Its state has
//! another shape than count's (a bare count), so it declares state version
//! 2, and the same module migrates version-0 state: `cairn state migrate
//! --stage count --with count_first_seen.wasm --config '{"first_seen": MS}'`
//! (docs/UPGRADES.md). The Rust port of examples/upgrade/count_first_seen.

#[macro_use]
#[path = "../../sdk-rust/cairn.rs"]
mod cairn;

use cairn::{Context, Entry, Migration, Migrator, Operator, Record};

struct CountFirstSeen {
    buf: Vec<u8>, // a scratch buffer, never state
}

impl Operator for CountFirstSeen {
    fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
        let (n, first) = match c.get(b"") {
            Some(v) => parse(v).ok_or_else(|| {
                format!("count_first_seen: state {:?} is not \"count,first_seen\" (state version 2): migrate it first", String::from_utf8_lossy(v))
            })?,
            None => (0, r.time),
        };
        self.buf.clear();
        format_i64(&mut self.buf, (n + 1) as i64);
        self.buf.push(b',');
        format_i64(&mut self.buf, first);
        c.put(b"", &self.buf);
        c.emit(r.key, &self.buf, r.time);
        Ok(())
    }
}

/// The migration of version-0 state (a bare count) to version 2: a count
/// `12` becomes `12,<first_seen>`, the config's first_seen (Unix ms, 0 by
/// default): the old state never recorded it.
struct FromCount {
    first_seen: i64,
    buf: Vec<u8>,
}

impl FromCount {
    fn new() -> FromCount {
        let first_seen = match config_first_seen(cairn::config()) {
            Some(v) => v,
            None => panic!("count_first_seen: config {:?}: want {{\"first_seen\": MS}}", String::from_utf8_lossy(cairn::config())),
        };
        FromCount { first_seen, buf: Vec::new() }
    }
}

impl Migration for FromCount {
    fn migrate(&mut self, m: &mut Migrator, e: Entry) -> cairn::Result {
        if e.timer || !e.sub.is_empty() {
            m.put(&e); // count keeps nothing else: pass it on unchanged
            return Ok(());
        }
        if parse_u64(e.value).is_none() {
            return Err(format!("not a version-0 count: {:?}", String::from_utf8_lossy(e.value)).into());
        }
        self.buf.clear();
        self.buf.extend_from_slice(e.value);
        self.buf.push(b',');
        format_i64(&mut self.buf, self.first_seen);
        m.put(&Entry { value: &self.buf, ..e });
        Ok(())
    }
}

/// parse reads "count,first_seen".
fn parse(v: &[u8]) -> Option<(u64, i64)> {
    let i = v.iter().position(|&c| c == b',')?;
    let n = parse_u64(&v[..i])?;
    let first = std::str::from_utf8(&v[i + 1..]).ok()?.parse().ok()?;
    Some((n, first))
}

/// parse_u64 parses decimal ASCII (at most 19 digits).
fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    let mut n = 0u64;
    for &ch in b {
        let d = ch.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n * 10 + d as u64;
    }
    Some(n)
}

/// format_i64 appends n in decimal to buf.
fn format_i64(buf: &mut Vec<u8>, n: i64) {
    use std::io::Write;
    let _ = write!(buf, "{}", n);
}

/// config_first_seen reads {"first_seen": N} (empty config: 0): the one
/// field this module takes, without a JSON library.
fn config_first_seen(c: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(c).ok()?.trim();
    if s.is_empty() || s == "{}" {
        return Some(0);
    }
    let body = s.strip_prefix('{')?.strip_suffix('}')?.trim();
    let (k, v) = body.split_once(':')?;
    if k.trim() != "\"first_seen\"" {
        return None;
    }
    v.trim().parse().ok()
}

cairn_operator!(CountFirstSeen { buf: Vec::new() });
cairn_migration!(2, FromCount::new());
