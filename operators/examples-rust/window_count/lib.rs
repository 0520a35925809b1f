//! window_count is a keyed operator counting records per key in tumbling
//! windows. Config: {"size_ms": N, "time": "event"|"processing"} (defaults
//! 60000 and "event"). The count of the window starting at s lives in state
//! sub-key s (decimal); a timer of the window's domain at its end - 1 emits
//! (key, "start,count", end - 1) for every window of the key that has ended
//! (found with scan) and deletes their state. The Rust port of
//! operators/examples/window_count.

#[macro_use]
#[path = "../../sdk-rust/cairn.rs"]
mod cairn;

use cairn::{Context, Operator, Record, Timer};

struct WindowCount {
    size: i64,
    processing: bool,
}

impl WindowCount {
    /// from_config panics on a bad config: the instance fails to start,
    /// with the message, before the job reads any input.
    fn from_config() -> WindowCount {
        let mut w = WindowCount { size: 60000, processing: false };
        let cfg = String::from_utf8_lossy(cairn::config()).into_owned();
        if let Some(v) = json_field(&cfg, "size_ms") {
            match v.parse::<i64>() {
                Ok(n) if n > 0 => w.size = n,
                Ok(_) => {}
                Err(_) => panic!("window_count: bad config: size_ms {:?}", v),
            }
        }
        match json_field(&cfg, "time").as_deref() {
            None | Some("\"event\"") => {}
            Some("\"processing\"") => w.processing = true,
            Some(v) => panic!("window_count: config \"time\" is {}, want \"event\" or \"processing\"", v),
        }
        w
    }

    fn count(&self, c: &mut Context, start: i64) -> cairn::Result {
        let sub = start.to_string();
        let n: u64 = match c.get(sub.as_bytes()) {
            Some(v) => std::str::from_utf8(v)?.parse()?,
            None => 0,
        };
        c.put(sub.as_bytes(), (n + 1).to_string().as_bytes());
        Ok(())
    }
}

impl Operator for WindowCount {
    fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
        let t = if self.processing { c.proc_time() } else { r.time };
        let start = t.div_euclid(self.size) * self.size;
        self.count(c, start)?;
        if self.processing {
            c.register_processing_timer(start + self.size - 1);
        } else {
            c.register_event_timer(start + self.size - 1);
        }
        Ok(())
    }

    fn on_timer(&mut self, c: &mut Context, t: Timer) -> cairn::Result {
        if t.processing != self.processing {
            return Err("window_count: a timer of the other time domain".into());
        }
        // Every window of the key that has ended by the timer's time
        // (normally just the one whose timer this is), oldest first.
        let mut due: Vec<(i64, Vec<u8>)> = Vec::new();
        for (sub, v) in c.scan(b"") {
            if let Some(start) = std::str::from_utf8(&sub).ok().and_then(|s| s.parse::<i64>().ok()) {
                if start + self.size - 1 <= t.time {
                    due.push((start, v));
                }
            }
        }
        due.sort_by_key(|w| w.0);
        let key = t.key.to_vec();
        for (start, count) in due {
            let mut out = format!("{},", start).into_bytes();
            out.extend_from_slice(&count);
            c.emit(&key, &out, start + self.size - 1);
            c.delete(start.to_string().as_bytes());
        }
        Ok(())
    }
}

/// json_field returns the raw text of a top-level field of a flat JSON
/// object (a number, or a string with its quotes): enough for this config,
/// without a JSON crate.
fn json_field(json: &str, name: &str) -> Option<String> {
    let pat = format!("\"{}\"", name);
    let at = json.find(&pat)? + pat.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = if let Some(s) = rest.strip_prefix('"') {
        s.find('"')? + 2
    } else {
        rest.find(|ch: char| ch == ',' || ch == '}' || ch.is_whitespace()).unwrap_or(rest.len())
    };
    Some(rest[..end].to_string())
}

cairn_operator!(WindowCount::from_config());
