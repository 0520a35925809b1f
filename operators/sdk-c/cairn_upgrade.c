/*
 * cairn_upgrade.c: the state-version and migration exports of the C SDK
 * (cairn_upgrade.h, docs/ABI.md "State versions and migrations").
 */
#include "cairn_upgrade.h"

#include <stdlib.h>
#include <string.h>

/* cairn.c's, not part of the API: the last cairn_alloc buffer, and the
 * progress word the host reads to name the entry of a trap. */
const uint8_t *cairn_input_(uint32_t *cap);
int32_t *cairn_progress(void);

enum { MIGRATE_VERSION = 1, ENTRY_VALUE = 1, ENTRY_TIMER = 2, FLAG_EXPIRY = 1, FLAG_PROCESSING = 2 };
enum { TAG_ENTRY = 1, TAG_ERROR = 5 };
/* The smallest encoded entry: u8 kind, u8 flags, u32 key, u32 sub, i64 when, u32 value. */
enum { ENTRY_SIZE = 2 + 4 + 4 + 8 + 4 };

struct cairn_migrator {
	int32_t src;
};

static int32_t version;
static bool declared;
static int32_t to_version;
static cairn_migrate_fn migration;
static uint8_t *mout;
static size_t mout_len, mout_cap;
static char *merr;

void cairn_declare_state_version(int32_t v) { version = v, declared = true; }

void cairn_register_migration(int32_t to, cairn_migrate_fn fn) { to_version = to, migration = fn; }

__attribute__((export_name("cairn_state_version"))) int32_t cairn_state_version(void) { return declared ? version : to_version; }

static uint8_t *reserve(size_t n) {
	if (mout_len + n > mout_cap) {
		size_t c = mout_cap ? mout_cap : 4096;
		while (c < mout_len + n) c *= 2;
		mout = realloc(mout, c);
		if (!mout) __builtin_trap();
		mout_cap = c;
	}
	uint8_t *p = mout + mout_len;
	mout_len += n;
	return p;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); } /* wasm is little endian */
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static int64_t get_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }

static uint8_t *put_bytes(uint8_t *p, const void *b, size_t n) {
	put_u32(p, (uint32_t)n);
	if (n) memcpy(p + 4, b, n);
	return p + 4 + n;
}

void cairn_migrate_put(cairn_migrator *m, const cairn_entry *e) {
	uint8_t kind = ENTRY_VALUE, flags = 0;
	cairn_bytes sub = e->sub, value = e->value;
	int64_t when = 0;
	if (e->timer) {
		kind = ENTRY_TIMER, flags = e->processing ? FLAG_PROCESSING : 0, when = e->time;
		sub.len = 0, value.len = 0;
	} else if (e->has_expiry) {
		flags = FLAG_EXPIRY, when = e->expiry;
	}
	uint8_t *p = reserve(1 + 4 + 2 + 4 + e->key.len + 4 + sub.len + 8 + 4 + value.len);
	p[0] = TAG_ENTRY;
	put_u32(p + 1, (uint32_t)m->src);
	p[5] = kind, p[6] = flags;
	p = put_bytes(put_bytes(p + 7, e->key.data, e->key.len), sub.data, sub.len);
	memcpy(p, &when, 8);
	put_bytes(p + 8, value.data, value.len);
}

int cairn_migrate_error(cairn_migrator *m, const char *msg) {
	(void)m;
	free(merr);
	merr = strdup(msg ? msg : "");
	return CAIRN_ERR;
}

/* run decodes a migrate input and calls the migration per entry; it
 * returns an error message, or NULL. */
static const char *run(const uint8_t *b, size_t len, int32_t *src) {
	const uint8_t *end = b + len;
	int32_t *progress = cairn_progress();
	*src = -1;
#define NEED(n) \
	if ((size_t)(end - b) < (size_t)(n)) return "sdk: malformed migrate input: truncated"
	NEED(5);
	if (b[0] != MIGRATE_VERSION) return "sdk: malformed migrate input: version";
	uint32_t n = get_u32(b + 1);
	b += 5;
	if (n > (size_t)(end - b) / ENTRY_SIZE) return "sdk: malformed migrate input: entry count larger than the input";
	for (uint32_t i = 0; i < n; i++) {
		*src = -1; /* a malformed entry is the input's fault, not the migration's */
		cairn_entry e;
		memset(&e, 0, sizeof e);
		NEED(2);
		uint8_t kind = b[0], flags = b[1];
		b += 2;
		cairn_bytes *parts[2] = {&e.key, &e.sub};
		for (int j = 0; j < 2; j++) {
			NEED(4);
			parts[j]->len = get_u32(b);
			b += 4;
			NEED(parts[j]->len);
			parts[j]->data = b;
			b += parts[j]->len;
		}
		NEED(12);
		int64_t when = get_i64(b);
		e.value.len = get_u32(b + 8);
		b += 12;
		NEED(e.value.len);
		e.value.data = b;
		b += e.value.len;
		if (kind == ENTRY_TIMER) {
			e.timer = true, e.time = when, e.processing = (flags & FLAG_PROCESSING) != 0;
			e.sub.len = 0, e.value.len = 0;
		} else if (kind == ENTRY_VALUE) {
			e.has_expiry = (flags & FLAG_EXPIRY) != 0;
			e.expiry = e.has_expiry ? when : 0;
		} else {
			return "sdk: malformed migrate input: entry kind";
		}
		/* The progress word names the entry if the migration traps. */
		*src = *progress = (int32_t)i;
		cairn_migrator m = {(int32_t)i};
		if (migration(&m, &e) != CAIRN_OK) return merr ? merr : "the migration failed";
	}
	*src = -1;
	if (b != end) return "sdk: malformed migrate input: trailing bytes";
	return NULL;
#undef NEED
}

__attribute__((export_name("cairn_migrate"))) uint64_t cairn_migrate(uint32_t len) {
	mout_len = 0;
	reserve(1)[0] = MIGRATE_VERSION;
	free(merr);
	merr = NULL;
	uint32_t cap;
	const uint8_t *in = cairn_input_(&cap);
	int32_t src = -1;
	const char *err;
	if (len > cap) {
		err = "sdk: input longer than the allocated buffer";
	} else if (!migration) {
		err = "sdk: no migration registered (use CAIRN_MIGRATION)";
	} else {
		err = run(in, len, &src);
	}
	*cairn_progress() = INT32_MIN;
	if (err) {
		size_t n = strlen(err);
		mout_len = 1; /* drop everything else: only the error entry counts */
		uint8_t *p = reserve(1 + 4 + 4 + n);
		p[0] = TAG_ERROR;
		put_u32(p + 1, (uint32_t)src);
		put_bytes(p + 5, err, n);
	}
	return (uint64_t)(uintptr_t)mout << 32 | mout_len;
}
