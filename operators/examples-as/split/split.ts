// split is a stateless operator: each record's value is a line of text,
// and it emits one record per word, keyed by the word in lower case with
// punctuation stripped, with value "1" and the record's time. The
// AssemblyScript port of operators/examples/split (ASCII letters and
// digits are kept, like every character outside ASCII).
import { Context, Record, register, str, utf8 } from "../../sdk-as/cairn";
export { cairn_alloc, cairn_process, cairn_progress } from "../../sdk-as/cairn";

const one = utf8("1");

function keep(ch: i32): bool {
  return (ch >= 48 && ch <= 57) || (ch >= 65 && ch <= 90) || (ch >= 97 && ch <= 122) || ch >= 128;
}

function onRecord(c: Context, r: Record): bool {
  const fields = str(r.value).split(" ");
  for (let i = 0; i < fields.length; i++) {
    const f = fields[i];
    let word = "";
    for (let j = 0; j < f.length; j++) {
      const ch = f.charCodeAt(j);
      if (keep(ch) && ch != 0xa0 && ch != 0x3000 && !(ch >= 0x2000 && ch <= 0x200a)) word += f.charAt(j);
    }
    if (word.length > 0) c.emit(utf8(word.toLowerCase()), one, r.time);
  }
  return true;
}

register(onRecord);
