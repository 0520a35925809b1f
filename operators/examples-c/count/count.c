/*
 * count is a keyed operator: it keeps a running count per key in the key's
 * state and emits (key, count as decimal ASCII, time) per record. The C
 * port of operators/examples/count.
 */
#include "cairn.h"

#include <stdio.h>

/* parse_count parses the decimal ASCII of a count (at most 19 digits). */
static bool parse_count(cairn_bytes b, uint64_t *n) {
	if (b.len == 0 || b.len > 19) return false;
	*n = 0;
	for (size_t i = 0; i < b.len; i++) {
		unsigned d = (unsigned)b.data[i] - '0';
		if (d > 9) return false;
		*n = *n * 10 + d;
	}
	return true;
}

/* format_u64 writes n in decimal at the end of buf[20]; returns the start. */
static char *format_u64(char buf[20], uint64_t n) {
	char *p = buf + 20;
	do {
		*--p = (char)('0' + n % 10);
		n /= 10;
	} while (n);
	return p;
}

static int on_record(cairn_ctx *c, const cairn_record *r) {
	uint64_t n = 0;
	cairn_bytes v;
	if (cairn_get(c, "", 0, &v) && !parse_count(v, &n)) {
		char msg[64];
		snprintf(msg, sizeof msg, "count: corrupt state \"%.*s\"", (int)(v.len < 32 ? v.len : 32), (const char *)v.data);
		return cairn_error(c, msg);
	}
	char buf[20];
	char *s = format_u64(buf, n + 1);
	size_t len = (size_t)(buf + 20 - s);
	cairn_put(c, "", 0, s, len);
	cairn_emit(c, r->key.data, r->key.len, s, len, r->time);
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, NULL)
