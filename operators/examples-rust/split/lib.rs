//! split is a stateless operator: each record's value is a line of text,
//! and it emits one record per word, keyed by the word in lower case with
//! punctuation stripped, with value "1" and the record's time. The Rust
//! port of operators/examples/split.

#[macro_use]
#[path = "../../sdk-rust/cairn.rs"]
mod cairn;

use cairn::{Context, Operator, Record};

struct Split {
    word: String,
}

impl Operator for Split {
    fn on_record(&mut self, c: &mut Context, r: Record) -> cairn::Result {
        let line = String::from_utf8_lossy(r.value);
        for field in line.split_whitespace() {
            self.word.clear();
            for ch in field.chars().filter(|ch| ch.is_alphanumeric()) {
                self.word.extend(ch.to_lowercase());
            }
            if !self.word.is_empty() {
                c.emit(self.word.as_bytes(), b"1", r.time);
            }
        }
        Ok(())
    }
}

cairn_operator!(Split { word: String::new() });
