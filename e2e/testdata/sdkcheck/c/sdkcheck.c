/* sdkcheck: the C twin of ../go/main.go (see there): exercises the whole C
 * SDK from commands in the record values. */
#include "cairn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *sub(const char *s) { return strcmp(s, "-") == 0 ? "" : s; }

static int sum(char *dst, size_t cap, cairn_bytes v) {
	uint64_t n = 0;
	for (size_t i = 0; i < v.len; i++) n += v.data[i];
	return snprintf(dst, cap, "%zu:%" PRIu64, v.len, n);
}

typedef struct {
	char *buf;
	size_t len, cap;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->buf = realloc(b->buf, b->cap);
	}
	memcpy(b->buf + b->len, s, n);
	b->len += n;
	b->buf[b->len] = 0;
}

static int scan_part(void *arg, cairn_bytes s, cairn_bytes v) {
	strbuf *b = arg;
	char tmp[64];
	if (b->len > 0) sb_add(b, ",", 1);
	sb_add(b, (const char *)s.data, s.len);
	sb_add(b, "=", 1);
	sb_add(b, tmp, (size_t)sum(tmp, sizeof tmp, v));
	return 0;
}

static int on_record(cairn_ctx *c, const cairn_record *r) {
	char line[256], *f[4] = {"", "", "", ""};
	snprintf(line, sizeof line, "%.*s", (int)r->value.len, (const char *)r->value.data);
	int nf = 0;
	for (char *tok = strtok(line, " "); tok && nf < 4; tok = strtok(NULL, " ")) f[nf++] = tok;
	int64_t num1 = strtoll(f[1], NULL, 10);
	char out[512];
	int n;
	if (strcmp(f[0], "put") == 0) {
		long len = strtol(f[2], NULL, 10);
		char *v = malloc((size_t)len + 1);
		for (long i = 0; i < len; i++) v[i] = (char)('a' + i % 26);
		cairn_put(c, sub(f[1]), strlen(sub(f[1])), v, (size_t)len);
		free(v);
	} else if (strcmp(f[0], "get") == 0) {
		cairn_bytes v;
		if (cairn_get(c, sub(f[1]), strlen(sub(f[1])), &v)) {
			n = snprintf(out, sizeof out, "%s=", f[1]);
			n += sum(out + n, sizeof out - (size_t)n, v);
		} else {
			n = snprintf(out, sizeof out, "%s=absent", f[1]);
		}
		cairn_emit(c, r->key.data, r->key.len, out, (size_t)n, r->time);
	} else if (strcmp(f[0], "del") == 0) {
		cairn_delete(c, sub(f[1]), strlen(sub(f[1])));
	} else if (strcmp(f[0], "scan") == 0) {
		strbuf b = {0};
		sb_add(&b, "", 0);
		cairn_scan(c, sub(f[1]), strlen(sub(f[1])), scan_part, &b);
		cairn_emit(c, r->key.data, r->key.len, b.buf, b.len, r->time);
		free(b.buf);
	} else if (strcmp(f[0], "etimer") == 0) {
		cairn_register_event_timer(c, num1);
	} else if (strcmp(f[0], "edel") == 0) {
		cairn_delete_event_timer(c, num1);
	} else if (strcmp(f[0], "ptimer") == 0) {
		cairn_register_processing_timer(c, num1);
	} else if (strcmp(f[0], "pdel") == 0) {
		cairn_delete_processing_timer(c, num1);
	} else if (strcmp(f[0], "info") == 0) {
		cairn_bytes cfg = cairn_config(), key = cairn_key(c);
		n = snprintf(out, sizeof out, "pt=%" PRId64 " cfg=%.*s key=%.*s", cairn_proc_time(c),
			     (int)cfg.len, (const char *)cfg.data, (int)key.len, (const char *)key.data);
		cairn_emit(c, r->key.data, r->key.len, out, (size_t)n, r->time);
	} else if (strcmp(f[0], "log") == 0) {
		cairn_log(c, CAIRN_INFO, "sdkcheck logs");
	} else if (strcmp(f[0], "rekey") == 0) {
		cairn_emit(c, f[1], strlen(f[1]), "moved", 5, r->time);
	} else if (strcmp(f[0], "fail") == 0) {
		return cairn_error(c, "failed on purpose");
	} else if (strcmp(f[0], "crash") == 0) {
		abort();
	}
	return CAIRN_OK;
}

static int on_timer(cairn_ctx *c, const cairn_timer *t) {
	char out[64];
	int n = snprintf(out, sizeof out, "timer %s %" PRId64, t->processing ? "p" : "e", t->time);
	cairn_emit(c, t->key.data, t->key.len, out, (size_t)n, t->time);
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, on_timer)
