/*
 * count_first_seen is version 2 of the word count's keyed stage: it keeps,
 * per key, the count and the event time the key was first seen, as
 * "count,first_seen" (decimal ASCII), and emits that. Its state has another
 * shape than count's (a bare count), so it declares state version 2, and
 * the same module migrates version-0 state: `cairn state migrate --stage
 * count --with count_first_seen.wasm --config '{"first_seen": MS}'`
 * (docs/UPGRADES.md). The C port of examples/upgrade/count_first_seen;
 * built with cairn_upgrade.c.
 */
#include "cairn.h"
#include "cairn_upgrade.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* parse_u64 parses decimal ASCII (at most 19 digits). */
static bool parse_u64(const uint8_t *b, size_t n, uint64_t *v) {
	if (n == 0 || n > 19) return false;
	*v = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned d = (unsigned)b[i] - '0';
		if (d > 9) return false;
		*v = *v * 10 + d;
	}
	return true;
}

/* parse reads "count,first_seen". */
static bool parse(cairn_bytes v, uint64_t *n, int64_t *first) {
	const uint8_t *comma = memchr(v.data, ',', v.len);
	if (!comma || !parse_u64(v.data, (size_t)(comma - v.data), n)) return false;
	size_t rest = v.len - (size_t)(comma - v.data) - 1;
	char buf[24];
	if (rest == 0 || rest >= sizeof buf) return false;
	memcpy(buf, comma + 1, rest);
	buf[rest] = 0;
	char *end;
	*first = strtoll(buf, &end, 10);
	return *end == 0;
}

static int on_record(cairn_ctx *c, const cairn_record *r) {
	uint64_t n = 0;
	int64_t first = r->time;
	cairn_bytes v;
	if (cairn_get(c, "", 0, &v) && !parse(v, &n, &first)) {
		char msg[160];
		snprintf(msg, sizeof msg, "count_first_seen: state \"%.*s\" is not \"count,first_seen\" (state version 2): migrate it first",
			 (int)(v.len < 32 ? v.len : 32), (const char *)v.data);
		return cairn_error(c, msg);
	}
	char buf[48];
	int len = snprintf(buf, sizeof buf, "%" PRIu64 ",%" PRId64, n + 1, first);
	cairn_put(c, "", 0, buf, (size_t)len);
	cairn_emit(c, r->key.data, r->key.len, buf, (size_t)len, r->time);
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, NULL)

/* first_seen is the config's {"first_seen": N} (Unix ms; 0 without one):
 * the first time of a key counted before the upgrade, which the old state
 * never recorded. Read once per instance, at its first migration call. */
static int64_t first_seen;
static bool first_seen_read;

static bool read_first_seen(void) {
	cairn_bytes c = cairn_config();
	char buf[128];
	if (c.len >= sizeof buf) return false;
	memcpy(buf, c.data, c.len);
	buf[c.len] = 0;
	const char *p = strstr(buf, "\"first_seen\"");
	if (!p) return c.len == 0 || strspn(buf, "{} \t\n") == c.len;
	p = strchr(p, ':');
	if (!p) return false;
	char *end;
	first_seen = strtoll(p + 1, &end, 10);
	return end != p + 1;
}

static int migrate(cairn_migrator *m, const cairn_entry *e) {
	if (!first_seen_read) {
		if (!read_first_seen()) return cairn_migrate_error(m, "count_first_seen: config: want {\"first_seen\": MS}");
		first_seen_read = true;
	}
	if (e->timer || e->sub.len) {
		cairn_migrate_put(m, e); /* count keeps nothing else: pass it on unchanged */
		return CAIRN_OK;
	}
	uint64_t n;
	if (!parse_u64(e->value.data, e->value.len, &n)) {
		char msg[96];
		snprintf(msg, sizeof msg, "not a version-0 count: \"%.*s\"", (int)(e->value.len < 32 ? e->value.len : 32), (const char *)e->value.data);
		return cairn_migrate_error(m, msg);
	}
	char buf[48];
	int len = snprintf(buf, sizeof buf, "%" PRIu64 ",%" PRId64, n, first_seen);
	cairn_entry out = *e;
	out.value = (cairn_bytes){(const uint8_t *)buf, (size_t)len};
	cairn_migrate_put(m, &out);
	return CAIRN_OK;
}

CAIRN_MIGRATION(2, migrate)
