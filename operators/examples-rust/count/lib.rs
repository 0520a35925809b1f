//! count is a keyed operator: it keeps a running count per key in the
//! key's state and emits (key, count as decimal ASCII, time) per record.
//! The Rust port of operators/examples/count.

#[macro_use]
#[path = "../../sdk-rust/cairn.rs"]
mod cairn;

use cairn::{Context, Operator, Record};

struct Count {
    buf: Vec<u8>, // a scratch buffer, never state
}

impl Operator for Count {
    fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
        let n = match c.get(b"") {
            Some(v) => parse_count(v).ok_or_else(|| format!("count: corrupt state {:?}", String::from_utf8_lossy(v)))?,
            None => 0,
        };
        format_u64(&mut self.buf, n + 1);
        c.put(b"", &self.buf);
        c.emit(r.key, &self.buf, r.time);
        Ok(())
    }
}

/// parse_count parses the decimal ASCII of a count (at most 19 digits).
fn parse_count(b: &[u8]) -> Option<u64> {
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

/// format_u64 writes n in decimal into buf.
fn format_u64(buf: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.clear();
    buf.extend_from_slice(&tmp[i..]);
}

cairn_operator!(Count { buf: Vec::new() });
