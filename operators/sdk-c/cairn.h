/*
 * cairn.h: the cairn operator SDK for C (ABI v1, docs/ABI.md). Two files,
 * cairn.h and cairn.c, no dependencies beyond wasi-libc; built with Debian's
 * clang, lld, wasi-libc and libclang-rt-14-dev-wasm32:
 *
 *   clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wl,--strip-all \
 *         -o op.wasm op.c cairn.c
 *
 * An operator defines its callbacks and installs them with CAIRN_OPERATOR:
 *
 *   #include "cairn.h"
 *
 *   static int on_record(cairn_ctx *c, const cairn_record *r) {
 *       cairn_bytes v;
 *       long n = cairn_get(c, "", 0, &v) ? strtol(...) : 0;   // the key's state
 *       ...
 *       cairn_put(c, "", 0, buf, len);                       // copied
 *       cairn_emit(c, r->key.data, r->key.len, buf, len, r->time);
 *       return CAIRN_OK;      // or: return cairn_error(c, "why");
 *   }
 *   CAIRN_OPERATOR(on_record, NULL)
 *
 * State is owned by the host: keep nothing you need across calls in global
 * variables (instances are replaced after a failure and on restore); read
 * and write it through the context. Bytes handed to the operator (record
 * key and value, state values) are valid only until the callback returns.
 * A callback that returns an error fails the whole call: the engine
 * dead-letters the record with the message. A trap (abort, a bad pointer)
 * does the same, named by the progress word the SDK keeps.
 */
#ifndef CAIRN_H
#define CAIRN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A byte string borrowed from the SDK. */
typedef struct {
	const uint8_t *data;
	size_t len;
} cairn_bytes;

/* An input record; time is the event time in Unix milliseconds. */
typedef struct {
	cairn_bytes key;
	cairn_bytes value;
	int64_t time;
} cairn_record;

/* A fired timer of the current key. */
typedef struct {
	cairn_bytes key;
	int64_t time;
	bool processing; /* a processing-time timer (else event time) */
} cairn_timer;

/* The operator's view of the call while it handles one record or timer. */
typedef struct cairn_ctx cairn_ctx;

#define CAIRN_OK 0
#define CAIRN_ERR (-1)

/* Log levels, with slog's numbering. */
enum { CAIRN_DEBUG = -4, CAIRN_INFO = 0, CAIRN_WARN = 4, CAIRN_ERROR = 8 };

typedef int (*cairn_record_fn)(cairn_ctx *c, const cairn_record *r);
typedef int (*cairn_timer_fn)(cairn_ctx *c, const cairn_timer *t);

/* cairn_register installs the operator's callbacks (on_timer may be NULL).
 * Call it from a constructor, or use CAIRN_OPERATOR. */
void cairn_register(cairn_record_fn on_record, cairn_timer_fn on_timer);

/* CAIRN_OPERATOR(on_record, on_timer) installs the callbacks when the
 * instance starts (in _initialize, which runs constructors). */
#define CAIRN_OPERATOR(on_record, on_timer)                                   \
	__attribute__((constructor)) static void cairn_operator_init_(void) { \
		cairn_register((on_record), (on_timer));                      \
	}

/* The current key. */
cairn_bytes cairn_key(const cairn_ctx *c);
/* The watermark at the call (Unix ms; INT64_MIN before the first). */
int64_t cairn_watermark(const cairn_ctx *c);
/* The stage's processing clock at the call (Unix ms; ingestion time). */
int64_t cairn_proc_time(const cairn_ctx *c);
/* The operator's config (the stage's config from the job file). Callable
 * from a constructor too. */
cairn_bytes cairn_config(void);

/* cairn_get looks up sub-key sub of the current key's state, this call's
 * writes included: true and *v set when present. Sub-key "" (length 0) is
 * prefetched: no host call. */
bool cairn_get(cairn_ctx *c, const void *sub, size_t sub_len, cairn_bytes *v);
/* cairn_put sets sub-key sub to a copy of the value. */
void cairn_put(cairn_ctx *c, const void *sub, size_t sub_len, const void *v, size_t v_len);
/* cairn_delete removes sub-key sub. */
void cairn_delete(cairn_ctx *c, const void *sub, size_t sub_len);
/* cairn_scan calls fn for every sub-key of the current key starting with
 * prefix, in sub-key order, this call's writes included, until fn returns
 * non-zero. The bytes are valid until cairn_scan returns. */
void cairn_scan(cairn_ctx *c, const void *prefix, size_t prefix_len,
		int (*fn)(void *arg, cairn_bytes sub, cairn_bytes value), void *arg);

/* cairn_emit outputs a record (copied). Its key decides the partition. */
void cairn_emit(cairn_ctx *c, const void *key, size_t key_len, const void *v, size_t v_len, int64_t time);

/* Timers of the current key: on_timer runs once the watermark (event
 * time) or the processing clock passes t. */
void cairn_register_event_timer(cairn_ctx *c, int64_t t);
void cairn_delete_event_timer(cairn_ctx *c, int64_t t);
void cairn_register_processing_timer(cairn_ctx *c, int64_t t);
void cairn_delete_processing_timer(cairn_ctx *c, int64_t t);

/* cairn_log logs a line when the call succeeds; cairn_log_now right away
 * (from a constructor, or before something that may crash). */
void cairn_log(cairn_ctx *c, int level, const char *msg);
void cairn_log_now(int level, const char *msg);

/* cairn_error sets the message of the call's failure and returns CAIRN_ERR:
 * `return cairn_error(c, "bad value");` */
int cairn_error(cairn_ctx *c, const char *msg);

#ifdef __cplusplus
}
#endif

#endif
