//! sdkcheck: the Rust twin of ../go/main.go (see there): exercises the whole
//! Rust SDK from commands in the record values.

#[macro_use]
#[path = "../../../../operators/sdk-rust/cairn.rs"]
mod cairn;

use cairn::{Context, Level, Operator, Record, Timer};

struct Check;

fn sub(s: &str) -> &[u8] {
    if s == "-" {
        b""
    } else {
        s.as_bytes()
    }
}

fn sum(v: &[u8]) -> String {
    format!("{}:{}", v.len(), v.iter().map(|&b| b as u64).sum::<u64>())
}

impl Operator for Check {
    fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
        let line = String::from_utf8_lossy(r.value).into_owned();
        let f: Vec<&str> = line.split_whitespace().collect();
        let arg = |i: usize| f.get(i).copied().unwrap_or("");
        let num = |i: usize| arg(i).parse::<i64>().unwrap_or(0);
        match arg(0) {
            "put" => {
                let v: Vec<u8> = (0..num(2)).map(|i| b'a' + (i % 26) as u8).collect();
                c.put(sub(arg(1)), &v);
            }
            "get" => {
                let s = match c.get(sub(arg(1))) {
                    Some(v) => format!("{}={}", arg(1), sum(v)),
                    None => format!("{}=absent", arg(1)),
                };
                c.emit(r.key, s.as_bytes(), r.time);
            }
            "del" => c.delete(sub(arg(1))),
            "scan" => {
                let parts: Vec<String> = c
                    .scan(sub(arg(1)))
                    .iter()
                    .map(|(s, v)| format!("{}={}", String::from_utf8_lossy(s), sum(v)))
                    .collect();
                c.emit(r.key, parts.join(",").as_bytes(), r.time);
            }
            "etimer" => c.register_event_timer(num(1)),
            "edel" => c.delete_event_timer(num(1)),
            "ptimer" => c.register_processing_timer(num(1)),
            "pdel" => c.delete_processing_timer(num(1)),
            "info" => {
                let s = format!(
                    "pt={} cfg={} key={}",
                    c.proc_time(),
                    String::from_utf8_lossy(c.config()),
                    String::from_utf8_lossy(c.key())
                );
                c.emit(r.key, s.as_bytes(), r.time);
            }
            "log" => c.log(Level::Info, "sdkcheck logs"),
            "rekey" => c.emit(arg(1).as_bytes(), b"moved", r.time),
            "fail" => return Err("failed on purpose".into()),
            "crash" => panic!("crashed on purpose"),
            _ => {}
        }
        Ok(())
    }

    fn on_timer(&mut self, c: &mut Context, t: Timer) -> cairn::Result {
        let s = format!("timer {} {}", if t.processing { "p" } else { "e" }, t.time);
        c.emit(t.key, s.as_bytes(), t.time);
        Ok(())
    }
}

cairn_operator!(Check);
