/*
 * split is a stateless operator: each record's value is a line of text,
 * and it emits one record per word, keyed by the word in lower case with
 * punctuation stripped, with value "1" and the record's time. The C port
 * of operators/examples/split (ASCII letters and digits; other bytes, as
 * UTF-8 sequences, are kept as they are).
 */
#include "cairn.h"

#include <ctype.h>
#include <stdlib.h>

static int on_record(cairn_ctx *c, const cairn_record *r) {
	const uint8_t *p = r->value.data, *end = p + r->value.len;
	char *word = malloc(r->value.len + 1);
	if (!word) return cairn_error(c, "split: out of memory");
	while (p < end) {
		while (p < end && isspace(*p)) p++;
		size_t n = 0;
		while (p < end && !isspace(*p)) {
			uint8_t ch = *p++;
			if (ch >= 0x80) word[n++] = (char)ch; /* part of a UTF-8 letter */
			else if (isalnum(ch)) word[n++] = (char)tolower(ch);
		}
		if (n > 0) cairn_emit(c, word, n, "1", 1, r->time);
	}
	free(word);
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, NULL)
