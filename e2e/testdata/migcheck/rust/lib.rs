//! migcheck: the Rust twin of ../go (see there).

#[macro_use]
#[path = "../../../../operators/sdk-rust/cairn.rs"]
mod cairn;

use cairn::{Context, Entry, Migration, Migrator, Operator, Record};

struct Nop;

impl Operator for Nop {
    fn on_record(&mut self, _c: &mut Context, _r: Record) -> cairn::Result {
        Ok(())
    }
}

struct Check {
    val: Vec<u8>,
    sub: Vec<u8>,
}

impl Migration for Check {
    fn migrate(&mut self, m: &mut Migrator, e: Entry) -> cairn::Result {
        if e.key == b"bad" {
            return Err("bad key".into());
        }
        if e.key == b"boom" {
            panic!("boom");
        }
        if e.timer {
            m.put(&Entry { time: e.time + 10, ..e });
            return Ok(());
        }
        if e.sub.starts_with(b"drop") {
            return Ok(());
        }
        self.val.clear();
        self.val.extend_from_slice(b"v2:");
        self.val.extend_from_slice(e.value);
        let expiry = if e.has_expiry { e.expiry + 1000 } else { e.expiry };
        m.put(&Entry { value: &self.val, expiry, ..e });
        self.sub.clear();
        self.sub.extend_from_slice(e.sub);
        self.sub.extend_from_slice(b".copy");
        m.put(&Entry { value: &self.val, sub: &self.sub, has_expiry: false, expiry: 0, ..e });
        Ok(())
    }
}

cairn_operator!(Nop);
cairn_migration!(5, Check { val: Vec::new(), sub: Vec::new() });
