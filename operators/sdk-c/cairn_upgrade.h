/*
 * cairn_upgrade.h: operator upgrades that change the shape of state
 * (docs/UPGRADES.md), for the C SDK. A module declares the version of its
 * state (CAIRN_STATE_VERSION), and a migration converts a stage's state
 * from an older version (CAIRN_MIGRATION), offline, with `cairn state
 * migrate --with MODULE.wasm`.
 *
 * It is a file of its own so that modules which do not use it export
 * nothing more than before: compiling cairn_upgrade.c in adds the exports
 * cairn_state_version and cairn_migrate (docs/ABI.md):
 *
 *   clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wl,--strip-all \
 *         -o op.wasm op.c cairn.c cairn_upgrade.c
 *
 * A migration is called once per entry of the stage's old state, key group
 * by key group, and writes the new state with cairn_migrate_put: any
 * number of entries (none drops the entry). The entries it writes keep the
 * key of the entry they came from, or another key of the same key group:
 * re-keying goes through `cairn state export` and `import`. Bytes of the
 * entry are valid only until the callback returns; keep nothing across
 * calls.
 *
 *   static int migrate(cairn_migrator *m, const cairn_entry *e) {
 *       if (e->timer || e->sub.len) { cairn_migrate_put(m, e); return CAIRN_OK; }
 *       cairn_entry n = *e;
 *       n.value = (cairn_bytes){buf, len};          // the new shape
 *       cairn_migrate_put(m, &n);                   // copied
 *       return CAIRN_OK;   // or: return cairn_migrate_error(m, "why");
 *   }
 *   CAIRN_MIGRATION(2, migrate)
 */
#ifndef CAIRN_UPGRADE_H
#define CAIRN_UPGRADE_H

#include "cairn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One entry of a stage's state: a value of (key, sub), or a timer of key. */
typedef struct {
	/* A timer (time, processing) rather than a value (sub, value,
	 * has_expiry, expiry). */
	bool timer;
	cairn_bytes key;
	cairn_bytes sub;
	cairn_bytes value;
	/* A value's TTL (Unix ms): a value written by a stage with a TTL
	 * expires then; a migration keeps, changes or drops it. */
	bool has_expiry;
	int64_t expiry;
	/* A timer's time (Unix ms) and domain (else event time). */
	int64_t time;
	bool processing;
} cairn_entry;

/* Writes the new state of one call. */
typedef struct cairn_migrator cairn_migrator;

typedef int (*cairn_migrate_fn)(cairn_migrator *m, const cairn_entry *e);

/* cairn_declare_state_version declares the version of the shape of the
 * state the module's operator reads and writes (0, the default, is "none
 * declared"). A job refuses to restore state of another version until it
 * is migrated. Call it from a constructor, or use CAIRN_STATE_VERSION. */
void cairn_declare_state_version(int32_t v);

/* cairn_register_migration installs a migration; to_version is the state
 * version of what it writes (the new operator's). Unless a state version
 * was declared, the module declares to_version. A module may install both
 * an operator and a migration: the new version of an operator that
 * migrates the old version's state. Call it from a constructor, or use
 * CAIRN_MIGRATION. */
void cairn_register_migration(int32_t to_version, cairn_migrate_fn fn);

#define CAIRN_STATE_VERSION(v)                                                     \
	__attribute__((constructor)) static void cairn_state_version_init_(void) { \
		cairn_declare_state_version((v));                                  \
	}

#define CAIRN_MIGRATION(to_version, fn)                                          \
	__attribute__((constructor)) static void cairn_migration_init_(void) { \
		cairn_register_migration((to_version), (fn));                  \
	}

/* cairn_migrate_put writes an entry of the new state (copied). */
void cairn_migrate_put(cairn_migrator *m, const cairn_entry *e);

/* cairn_migrate_error sets the message of the call's failure and returns
 * CAIRN_ERR: the whole migration stops, naming the key being migrated. */
int cairn_migrate_error(cairn_migrator *m, const char *msg);

#ifdef __cplusplus
}
#endif

#endif
