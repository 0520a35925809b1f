/*
 * window_count is a keyed operator counting records per key in tumbling
 * windows. Config: {"size_ms": N, "time": "event"|"processing"} (defaults
 * 60000 and "event"). The count of the window starting at s lives in state
 * sub-key s (decimal); a timer of the window's domain at its end - 1 emits
 * (key, "start,count", end - 1) for every window of the key that has ended
 * (found with cairn_scan) and deletes their state. The C port of
 * operators/examples/window_count.
 */
#include "cairn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t size = 60000;
static bool processing; /* windows by processing time */

static int64_t floor_div(int64_t a, int64_t b) {
	int64_t q = a / b;
	if (a % b != 0 && ((a < 0) != (b < 0))) q--;
	return q;
}

/* json_field finds a top-level field of a flat JSON object and returns its
 * raw text (a number, or a string with its quotes) in dst. */
static bool json_field(const char *json, const char *name, char *dst, size_t cap) {
	char pat[64];
	snprintf(pat, sizeof pat, "\"%s\"", name);
	const char *p = strstr(json, pat);
	if (!p) return false;
	p += strlen(pat);
	while (*p == ' ' || *p == '\t' || *p == '\n') p++;
	if (*p++ != ':') return false;
	while (*p == ' ' || *p == '\t' || *p == '\n') p++;
	size_t n = *p == '"' ? strcspn(p + 1, "\"") + 2 : strcspn(p, ",} \t\n");
	if (n >= cap) n = cap - 1;
	memcpy(dst, p, n);
	dst[n] = 0;
	return true;
}

/* A bad config aborts the instance's start, with the message logged. */
__attribute__((constructor)) static void configure(void) {
	cairn_bytes cfg = cairn_config();
	char *json = strndup((const char *)cfg.data, cfg.len);
	char v[64];
	if (json_field(json, "size_ms", v, sizeof v)) {
		char *end;
		long long n = strtoll(v, &end, 10);
		if (*end) {
			cairn_log_now(CAIRN_ERROR, "window_count: bad config: size_ms");
			abort();
		}
		if (n > 0) size = n;
	}
	if (json_field(json, "time", v, sizeof v)) {
		if (strcmp(v, "\"processing\"") == 0) {
			processing = true;
		} else if (strcmp(v, "\"event\"") != 0) {
			cairn_log_now(CAIRN_ERROR, "window_count: config \"time\" must be \"event\" or \"processing\"");
			abort();
		}
	}
	free(json);
}

static int on_record(cairn_ctx *c, const cairn_record *r) {
	int64_t start = floor_div(processing ? cairn_proc_time(c) : r->time, size) * size;
	char sub[24], val[24];
	int sn = snprintf(sub, sizeof sub, "%" PRId64, start);
	unsigned long long n = 0;
	cairn_bytes v;
	if (cairn_get(c, sub, (size_t)sn, &v)) {
		char tmp[24];
		snprintf(tmp, sizeof tmp, "%.*s", (int)(v.len < 23 ? v.len : 23), (const char *)v.data);
		n = strtoull(tmp, NULL, 10);
	}
	int vn = snprintf(val, sizeof val, "%llu", n + 1);
	cairn_put(c, sub, (size_t)sn, val, (size_t)vn);
	if (processing) cairn_register_processing_timer(c, start + size - 1);
	else cairn_register_event_timer(c, start + size - 1);
	return CAIRN_OK;
}

typedef struct {
	int64_t start;
	char *count;
	size_t count_len;
} window;

typedef struct {
	int64_t until;
	window *due;
	size_t n, cap;
} collect;

static int due_window(void *arg, cairn_bytes sub, cairn_bytes value) {
	collect *col = arg;
	char tmp[24], *end;
	if (sub.len == 0 || sub.len >= sizeof tmp) return 0;
	memcpy(tmp, sub.data, sub.len);
	tmp[sub.len] = 0;
	int64_t start = strtoll(tmp, &end, 10);
	if (*end || start + size - 1 > col->until) return 0;
	if (col->n == col->cap) {
		col->cap = col->cap ? 2 * col->cap : 8;
		col->due = realloc(col->due, col->cap * sizeof(window));
	}
	col->due[col->n++] = (window){start, strndup((const char *)value.data, value.len), value.len};
	return 0;
}

static int by_start(const void *a, const void *b) {
	int64_t x = ((const window *)a)->start, y = ((const window *)b)->start;
	return (x > y) - (x < y);
}

static int on_timer(cairn_ctx *c, const cairn_timer *t) {
	if (t->processing != processing) return cairn_error(c, "window_count: a timer of the other time domain");
	/* Every window of the key that has ended by the timer's time (normally
	 * just the one whose timer this is), oldest first. */
	collect col = {.until = t->time};
	cairn_scan(c, "", 0, due_window, &col);
	qsort(col.due, col.n, sizeof(window), by_start);
	for (size_t i = 0; i < col.n; i++) {
		window *w = &col.due[i];
		char out[64], sub[24];
		int n = snprintf(out, sizeof out, "%" PRId64 ",%.*s", w->start, (int)w->count_len, w->count);
		cairn_emit(c, t->key.data, t->key.len, out, (size_t)n, w->start + size - 1);
		int sn = snprintf(sub, sizeof sub, "%" PRId64, w->start);
		cairn_delete(c, sub, (size_t)sn);
		free(w->count);
	}
	free(col.due);
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, on_timer)
