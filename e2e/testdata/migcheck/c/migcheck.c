/* migcheck: the C twin of ../go (see there). */
#include "cairn.h"
#include "cairn_upgrade.h"

#include <stdlib.h>
#include <string.h>

static int on_record(cairn_ctx *c, const cairn_record *r) {
	(void)c, (void)r;
	return CAIRN_OK;
}

CAIRN_OPERATOR(on_record, NULL)

static bool is(cairn_bytes b, const char *s) { return b.len == strlen(s) && memcmp(b.data, s, b.len) == 0; }

static int migrate(cairn_migrator *m, const cairn_entry *e) {
	if (is(e->key, "bad")) return cairn_migrate_error(m, "bad key");
	if (is(e->key, "boom")) {
		cairn_log_now(CAIRN_ERROR, "boom");
		abort();
	}
	cairn_entry n = *e;
	if (e->timer) {
		n.time += 10;
		cairn_migrate_put(m, &n);
		return CAIRN_OK;
	}
	if (e->sub.len >= 4 && memcmp(e->sub.data, "drop", 4) == 0) return CAIRN_OK;
	uint8_t *val = malloc(3 + e->value.len), *sub = malloc(e->sub.len + 5);
	memcpy(val, "v2:", 3);
	if (e->value.len) memcpy(val + 3, e->value.data, e->value.len);
	n.value = (cairn_bytes){val, 3 + e->value.len};
	if (n.has_expiry) n.expiry += 1000;
	cairn_migrate_put(m, &n);
	if (e->sub.len) memcpy(sub, e->sub.data, e->sub.len);
	memcpy(sub + e->sub.len, ".copy", 5);
	n.sub = (cairn_bytes){sub, e->sub.len + 5};
	n.has_expiry = false, n.expiry = 0;
	cairn_migrate_put(m, &n);
	free(val);
	free(sub);
	return CAIRN_OK;
}

CAIRN_MIGRATION(5, migrate)
