/*
 * cairn.c: the cairn operator SDK for C (ABI v1). See cairn.h and
 * docs/ABI.md. It decodes each call's input in place, keeps an overlay of
 * the state the operator reads and writes in the call (one entry per
 * written (key, sub), written to the output at the end), and appends
 * emits, timers and logs to the output as they come.
 */
#include "cairn.h"

#include <stdlib.h>
#include <string.h>

/* --- host functions (module cairn_v1) --- */

#define IMPORT(name) __attribute__((import_module("cairn_v1"), import_name(name)))
IMPORT("state_get") int64_t cairn_host_state_get(const void *k, uint32_t kl, const void *s, uint32_t sl, void *d, uint32_t dc);
IMPORT("state_scan") int64_t cairn_host_state_scan(const void *k, uint32_t kl, const void *p, uint32_t pl, void *d, uint32_t dc);
IMPORT("log") void cairn_host_log(int32_t level, const void *p, uint32_t l);
IMPORT("config") uint32_t cairn_host_config(void *d, uint32_t dc);

enum { VERSION = 1, STATE_ABSENT = -1 };
enum { TAG_EMIT = 1, TAG_STATE = 2, TAG_TIMER = 3, TAG_LOG = 4, TAG_ERROR = 5 };
#define PROGRESS_IDLE INT32_MIN

/* --- the call's state --- */

struct cairn_ctx {
	uint32_t key_idx;
	int32_t src;
};

typedef struct {
	const uint8_t *key;
	uint32_t key_len;
	bool known, present, dirty; /* the value of "" below; written in the call */
	const uint8_t *val;
	uint32_t val_len;
	int32_t first_sub; /* index in subs of this key's first other sub-key, or -1 */
} key_state;

typedef struct {
	const uint8_t *sub, *val;
	uint32_t sub_len, val_len;
	bool present, dirty;
	int32_t next; /* the key's next sub-key, or -1 */
} sub_state;

/* arena blocks hold copies of the values put and fetched in a call. */
typedef struct block {
	struct block *next;
	size_t cap, used;
	uint8_t data[];
} block;

static cairn_record_fn op_record;
static cairn_timer_fn op_timer;
static int32_t progress = PROGRESS_IDLE;
static uint8_t *in_buf;
static uint32_t in_cap;
static int64_t in_watermark, in_proctime;
static key_state *keys;
static uint32_t n_keys, keys_cap;
static sub_state *subs;
static uint32_t n_subs, subs_cap;
static uint8_t *out;
static size_t out_len, out_cap;
static block *arena;
static uint8_t *get_buf;
static uint32_t get_cap;
static bool host_failed;
static char *err_msg;
static uint8_t *config_buf;
static uint32_t config_len;
static bool config_done;

static void oom(void) { __builtin_trap(); }

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
	if (need <= *cap) return p;
	size_t c = *cap ? *cap : 16;
	while (c < need) c *= 2;
	p = realloc(p, c * elem);
	if (!p) oom();
	*cap = c;
	return p;
}

static uint8_t *out_reserve(size_t n) {
	out = grow(out, &out_cap, out_len + n, 1);
	uint8_t *p = out + out_len;
	out_len += n;
	return p;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); } /* wasm is little endian */
static void put_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static int64_t get_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }

static uint8_t *out_bytes(uint8_t *p, const void *b, size_t n) {
	put_u32(p, (uint32_t)n);
	if (n) memcpy(p + 4, b, n);
	return p + 4 + n;
}

static const uint8_t *keep(const void *v, size_t n) {
	if (!arena || arena->cap - arena->used < n) {
		size_t cap = n > 65536 ? n : 65536;
		block *b = malloc(sizeof(block) + cap);
		if (!b) oom();
		b->next = arena, b->cap = cap, b->used = 0;
		arena = b;
	}
	uint8_t *p = arena->data + arena->used;
	if (n) memcpy(p, v, n);
	arena->used += n;
	return p;
}

static void arena_reset(void) {
	while (arena && arena->next) {
		block *n = arena->next;
		free(arena);
		arena = n;
	}
	if (arena) arena->used = 0;
}

/* fetch reads (key, sub) from the host into the arena. */
static bool fetch(const key_state *k, const void *sub, size_t sub_len, const uint8_t **v, uint32_t *v_len) {
	if (get_cap < 4096) {
		get_buf = realloc(get_buf, get_cap = 4096);
		if (!get_buf) oom();
	}
	for (;;) {
		int64_t n = cairn_host_state_get(k->key, k->key_len, sub, (uint32_t)sub_len, get_buf, get_cap);
		if (n == STATE_ABSENT) return false;
		if (n < 0) { /* the host failed: the call fails (the host reports why) */
			host_failed = true;
			return false;
		}
		if ((uint64_t)n <= get_cap) {
			*v = keep(get_buf, (size_t)n);
			*v_len = (uint32_t)n;
			return true;
		}
		free(get_buf);
		get_buf = malloc(get_cap = (uint32_t)n);
		if (!get_buf) oom();
	}
}

void cairn_register(cairn_record_fn on_record, cairn_timer_fn on_timer) {
	op_record = on_record;
	op_timer = on_timer;
}

cairn_bytes cairn_key(const cairn_ctx *c) { return (cairn_bytes){keys[c->key_idx].key, keys[c->key_idx].key_len}; }
int64_t cairn_watermark(const cairn_ctx *c) { (void)c; return in_watermark; }
int64_t cairn_proc_time(const cairn_ctx *c) { (void)c; return in_proctime; }

cairn_bytes cairn_config(void) {
	if (!config_done) {
		uint32_t cap = 256;
		for (;;) {
			config_buf = realloc(config_buf, cap);
			if (!config_buf) oom();
			config_len = cairn_host_config(config_buf, cap);
			if (config_len <= cap) break;
			cap = config_len;
		}
		config_done = true;
	}
	return (cairn_bytes){config_buf, config_len};
}

static sub_state *find_sub(key_state *k, const void *sub, size_t sub_len) {
	for (int32_t i = k->first_sub; i >= 0; i = subs[i].next) {
		if (subs[i].sub_len == sub_len && memcmp(subs[i].sub, sub, sub_len) == 0) return &subs[i];
	}
	return NULL;
}

static sub_state *add_sub(key_state *k, const void *sub, size_t sub_len) {
	size_t cap = subs_cap;
	subs = grow(subs, &cap, n_subs + 1, sizeof(sub_state));
	subs_cap = (uint32_t)cap;
	sub_state *s = &subs[n_subs];
	memset(s, 0, sizeof *s);
	s->sub = keep(sub, sub_len);
	s->sub_len = (uint32_t)sub_len;
	s->next = k->first_sub;
	k->first_sub = (int32_t)n_subs++;
	return s;
}

bool cairn_get(cairn_ctx *c, const void *sub, size_t sub_len, cairn_bytes *v) {
	key_state *k = &keys[c->key_idx];
	if (sub_len == 0) {
		if (!k->known) {
			k->present = fetch(k, "", 0, &k->val, &k->val_len);
			k->known = true;
		}
		if (k->present && v) *v = (cairn_bytes){k->val, k->val_len};
		return k->present;
	}
	sub_state *s = find_sub(k, sub, sub_len);
	if (!s) {
		const uint8_t *val = NULL;
		uint32_t len = 0;
		bool ok = fetch(k, sub, sub_len, &val, &len);
		s = add_sub(k, sub, sub_len);
		s->present = ok, s->val = val, s->val_len = len;
	}
	if (s->present && v) *v = (cairn_bytes){s->val, s->val_len};
	return s->present;
}

static void set(cairn_ctx *c, const void *sub, size_t sub_len, const void *v, size_t v_len, bool present) {
	key_state *k = &keys[c->key_idx];
	const uint8_t *val = present ? keep(v, v_len) : NULL;
	if (sub_len == 0) {
		k->known = true, k->present = present, k->dirty = true;
		k->val = val, k->val_len = present ? (uint32_t)v_len : 0;
		return;
	}
	sub_state *s = find_sub(k, sub, sub_len);
	if (!s) s = add_sub(k, sub, sub_len);
	s->present = present, s->dirty = true;
	s->val = val, s->val_len = present ? (uint32_t)v_len : 0;
}

void cairn_put(cairn_ctx *c, const void *sub, size_t sub_len, const void *v, size_t v_len) { set(c, sub, sub_len, v, v_len, true); }
void cairn_delete(cairn_ctx *c, const void *sub, size_t sub_len) { set(c, sub, sub_len, NULL, 0, false); }

typedef struct {
	cairn_bytes sub, val;
	bool present;
} scan_entry;

static int cmp_entry(const void *a, const void *b) {
	const cairn_bytes *x = &((const scan_entry *)a)->sub, *y = &((const scan_entry *)b)->sub;
	size_t n = x->len < y->len ? x->len : y->len;
	int r = n ? memcmp(x->data, y->data, n) : 0;
	if (r) return r;
	return x->len < y->len ? -1 : x->len > y->len;
}

static bool has_prefix(const uint8_t *s, size_t n, const void *p, size_t pn) { return n >= pn && (pn == 0 || memcmp(s, p, pn) == 0); }

/* overlay replaces the committed entry of e's sub-key with e, or adds e. */
static scan_entry *overlay(scan_entry *list, size_t *len, size_t *cap, size_t committed, scan_entry e) {
	for (size_t j = 0; j < committed; j++) {
		if (cmp_entry(&list[j], &e) == 0) {
			list[j] = e;
			return list;
		}
	}
	list = grow(list, cap, *len + 1, sizeof *list);
	list[(*len)++] = e;
	return list;
}

void cairn_scan(cairn_ctx *c, const void *prefix, size_t prefix_len, int (*fn)(void *arg, cairn_bytes sub, cairn_bytes value), void *arg) {
	key_state *k = &keys[c->key_idx];
	uint32_t cap = 4096;
	uint8_t *buf = NULL;
	int64_t n;
	for (;;) {
		buf = realloc(buf, cap);
		if (!buf) oom();
		n = cairn_host_state_scan(k->key, k->key_len, prefix, (uint32_t)prefix_len, buf, cap);
		if (n < 0) {
			host_failed = true;
			free(buf);
			return;
		}
		if ((uint64_t)n <= cap) break;
		cap = (uint32_t)n;
	}
	/* The committed entries, then this call's writes of the key (which
	 * replace them), sorted by sub-key. */
	scan_entry *list = NULL;
	size_t len = 0, lcap = 0;
	for (size_t off = 0; off < (size_t)n;) {
		scan_entry e = {.present = true};
		for (int part = 0; part < 2; part++) {
			if ((size_t)n - off < 4 || get_u32(buf + off) > (size_t)n - off - 4) {
				host_failed = true; /* a malformed scan result */
				free(buf), free(list);
				return;
			}
			cairn_bytes b = {buf + off + 4, get_u32(buf + off)};
			off += 4 + b.len;
			if (part == 0) e.sub = b; else e.val = b;
		}
		list = grow(list, &lcap, len + 1, sizeof *list);
		list[len++] = e;
	}
	size_t committed = len;
	if (k->dirty && prefix_len == 0) {
		scan_entry e = {{(const uint8_t *)"", 0}, {k->val, k->val_len}, k->present};
		list = overlay(list, &len, &lcap, committed, e);
	}
	for (int32_t i = k->first_sub; i >= 0; i = subs[i].next) {
		sub_state *s = &subs[i];
		if (s->dirty && has_prefix(s->sub, s->sub_len, prefix, prefix_len)) {
			scan_entry e = {{s->sub, s->sub_len}, {s->val, s->val_len}, s->present};
			list = overlay(list, &len, &lcap, committed, e);
		}
	}
	if (len > 1) qsort(list, len, sizeof *list, cmp_entry);
	for (size_t j = 0; j < len; j++) {
		if (list[j].present && fn(arg, list[j].sub, list[j].val) != 0) break;
	}
	free(list);
	free(buf);
}

void cairn_emit(cairn_ctx *c, const void *key, size_t key_len, const void *v, size_t v_len, int64_t time) {
	uint8_t *p = out_reserve(1 + 4 + 8 + 4 + key_len + 4 + v_len);
	p[0] = TAG_EMIT;
	put_u32(p + 1, (uint32_t)c->src);
	put_i64(p + 5, time);
	out_bytes(out_bytes(p + 13, key, key_len), v, v_len);
}

static void timer_op(cairn_ctx *c, int64_t t, bool processing, bool del) {
	uint8_t *p = out_reserve(1 + 1 + 4 + 8);
	p[0] = TAG_TIMER;
	p[1] = (uint8_t)((del ? 1 : 0) | (processing ? 2 : 0));
	put_u32(p + 2, c->key_idx);
	put_i64(p + 6, t);
}

void cairn_register_event_timer(cairn_ctx *c, int64_t t) { timer_op(c, t, false, false); }
void cairn_delete_event_timer(cairn_ctx *c, int64_t t) { timer_op(c, t, false, true); }
void cairn_register_processing_timer(cairn_ctx *c, int64_t t) { timer_op(c, t, true, false); }
void cairn_delete_processing_timer(cairn_ctx *c, int64_t t) { timer_op(c, t, true, true); }

void cairn_log(cairn_ctx *c, int level, const char *msg) {
	(void)c;
	size_t n = strlen(msg);
	uint8_t *p = out_reserve(1 + 4 + 4 + n);
	p[0] = TAG_LOG;
	put_u32(p + 1, (uint32_t)level);
	out_bytes(p + 5, msg, n);
}

void cairn_log_now(int level, const char *msg) { cairn_host_log(level, msg, (uint32_t)strlen(msg)); }

int cairn_error(cairn_ctx *c, const char *msg) {
	(void)c;
	free(err_msg);
	err_msg = strdup(msg ? msg : "");
	return CAIRN_ERR;
}

/* --- the exports the host calls --- */

__attribute__((export_name("cairn_alloc"))) uint8_t *cairn_alloc(uint32_t size) {
	free(in_buf);
	in_cap = size ? size : 1;
	in_buf = malloc(in_cap);
	if (!in_buf) oom();
	return in_buf;
}

__attribute__((export_name("cairn_progress"))) int32_t *cairn_progress(void) { return &progress; }

/* cairn_input_ is the last cairn_alloc buffer and its size, for the
 * migration exports of cairn_upgrade.c (not part of the API). */
const uint8_t *cairn_input_(uint32_t *cap) {
	*cap = in_buf ? in_cap : 0;
	return in_buf;
}

static void fail(int32_t src, const char *msg) {
	size_t n = strlen(msg);
	out_len = 1; /* drop everything else: only the error entry counts */
	uint8_t *p = out_reserve(1 + 4 + 4 + n);
	p[0] = TAG_ERROR;
	put_u32(p + 1, (uint32_t)src);
	out_bytes(p + 5, msg, n);
}

/* run decodes the input in place and runs the callbacks for its timers,
 * then its records; it returns an error message, or NULL. */
static const char *run(const uint8_t *b, size_t len, int32_t *src) {
	*src = PROGRESS_IDLE;
	const uint8_t *end = b + len;
#define NEED(n) \
	if ((size_t)(end - b) < (size_t)(n)) return "sdk: malformed input: truncated"
	NEED(1 + 8 + 8 + 4);
	if (b[0] != VERSION) return "sdk: malformed input: version";
	in_watermark = get_i64(b + 1);
	in_proctime = get_i64(b + 9);
	uint32_t n = get_u32(b + 17);
	b += 21;
	if (n > (size_t)(end - b) / 5) return "sdk: malformed input: key count larger than the input";
	size_t cap = keys_cap;
	keys = grow(keys, &cap, n ? n : 1, sizeof(key_state));
	keys_cap = (uint32_t)cap;
	n_keys = n;
	for (uint32_t i = 0; i < n; i++) {
		key_state *k = &keys[i];
		NEED(5);
		uint8_t f = b[0];
		k->key_len = get_u32(b + 1);
		b += 5;
		NEED(k->key_len);
		k->key = b;
		b += k->key_len;
		k->known = f != 0, k->present = f == 2, k->dirty = false;
		k->val = NULL, k->val_len = 0, k->first_sub = -1;
		if (f == 2) {
			NEED(4);
			k->val_len = get_u32(b);
			b += 4;
			NEED(k->val_len);
			k->val = b;
			b += k->val_len;
		} else if (f > 2) {
			return "sdk: malformed input: key fetch flag";
		}
	}
	NEED(4);
	uint32_t nt = get_u32(b);
	b += 4;
	if (nt > (size_t)(end - b) / 13) return "sdk: malformed input: timer count larger than the input";
	for (uint32_t i = 0; i < nt; i++, b += 13) {
		uint8_t fl = b[0];
		uint32_t ki = get_u32(b + 1);
		if ((fl & ~1) || ki >= n_keys) return "sdk: malformed input: timer entry";
		if (!op_timer) continue;
		*src = progress = -(int32_t)i - 1;
		cairn_ctx c = {ki, *src};
		cairn_timer t = {{keys[ki].key, keys[ki].key_len}, get_i64(b + 5), fl & 1};
		if (op_timer(&c, &t) != CAIRN_OK) return err_msg ? err_msg : "on_timer failed";
		if (host_failed) return "host failure";
		progress = PROGRESS_IDLE;
	}
	*src = PROGRESS_IDLE;
	NEED(4);
	uint32_t nr = get_u32(b);
	b += 4;
	if (nr > (size_t)(end - b) / 16) return "sdk: malformed input: record count larger than the input";
	for (uint32_t i = 0; i < nr; i++) {
		NEED(16);
		cairn_record r;
		uint32_t ki = get_u32(b);
		r.time = get_i64(b + 4);
		r.value.len = get_u32(b + 12);
		b += 16;
		NEED(r.value.len);
		r.value.data = b;
		b += r.value.len;
		if (ki >= n_keys) return "sdk: malformed input: record key index";
		r.key = (cairn_bytes){keys[ki].key, keys[ki].key_len};
		*src = progress = (int32_t)i;
		cairn_ctx c = {ki, (int32_t)i};
		if (op_record(&c, &r) != CAIRN_OK) return err_msg ? err_msg : "on_record failed";
		if (host_failed) return "host failure";
		progress = PROGRESS_IDLE;
	}
	*src = PROGRESS_IDLE;
	if (b != end) return "sdk: malformed input: trailing bytes";
	return NULL;
#undef NEED
}

static void state_op(uint32_t key_idx, const uint8_t *sub, uint32_t sub_len, const uint8_t *v, uint32_t v_len, bool present) {
	uint8_t *p = out_reserve(1 + 1 + 4 + 4 + sub_len + 4 + (present ? v_len : 0));
	p[0] = TAG_STATE;
	p[1] = present ? 0 : 1;
	put_u32(p + 2, key_idx);
	out_bytes(out_bytes(p + 6, sub, sub_len), v, present ? v_len : 0);
}

__attribute__((export_name("cairn_process"))) uint64_t cairn_process(uint32_t len) {
	out_len = 0;
	out_reserve(1)[0] = VERSION;
	arena_reset();
	n_subs = 0;
	host_failed = false;
	free(err_msg);
	err_msg = NULL;
	int32_t src = PROGRESS_IDLE;
	const char *err;
	if (len > in_cap) {
		err = "sdk: input longer than the allocated buffer";
	} else if (!op_record) {
		err = "sdk: no operator registered (use CAIRN_OPERATOR)";
	} else {
		err = run(in_buf, len, &src);
	}
	progress = PROGRESS_IDLE;
	if (err) {
		fail(src, err);
	} else {
		for (uint32_t i = 0; i < n_keys; i++) {
			key_state *k = &keys[i];
			if (k->dirty) state_op(i, NULL, 0, k->val, k->val_len, k->present);
		}
		for (uint32_t i = 0; i < n_keys; i++) {
			for (int32_t j = keys[i].first_sub; j >= 0; j = subs[j].next) {
				sub_state *s = &subs[j];
				if (s->dirty) state_op(i, s->sub, s->sub_len, s->val, s->val_len, s->present);
			}
		}
	}
	return (uint64_t)(uintptr_t)out << 32 | out_len;
}
