package job

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestSecurityFields: nats_auth combinations, the stage's sha256 pin and
// savepoints.retain are checked when the job is read, and the errors name
// fields, never a secret's value.
func TestSecurityFields(t *testing.T) {
	const pin = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		extra string
		field string // "" : valid
	}{
		{"nats_auth: {user: u, password: hunter2-secret}\n", ""},
		{"nats_auth: {user: u, password_file: pw}\n", ""},
		{"nats_auth: {token_file: tok}\n", ""},
		{"nats_auth: {creds_file: a.creds, tls_ca: ca.pem, tls_cert: c.pem, tls_key: k.pem}\n", ""},
		{"nats_auth: {user: u, password: hunter2-secret, password_file: pw}\n", "nats_auth.password_file"},
		{"nats_auth: {password: hunter2-secret}\n", "nats_auth.user"},
		{"nats_auth: {token: hunter2-secret, token_file: tok}\n", "nats_auth.token_file"},
		{"nats_auth: {creds_file: a.creds, user: u, password: hunter2-secret}\n", "nats_auth.user"},
		{"nats_auth: {nkey_file: seed, token: hunter2-secret}\n", "nats_auth.token"},
		{"nats_auth: {tls_cert: c.pem}\n", "nats_auth.tls_key"},
		{"savepoints: {retain: 2}\n", ""},
		{"savepoints: {retain: -1}\n", "savepoints.retain"},
		{"sha256: " + pin, ""},
		{"sha256: " + strings.ToUpper(pin), "stages[0].sha256"},
		{"sha256: abc", "stages[0].sha256"},
	} {
		src := good + tc.extra
		if s, ok := strings.CutPrefix(tc.extra, "sha256: "); ok {
			src = strings.Replace(good, `{name: split, module: "builtin:split"}`, fmt.Sprintf(`{name: split, module: "builtin:split", sha256: %q}`, s), 1)
		}
		_, err := Parse([]byte(src))
		if tc.field == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.extra, err)
			}
			continue
		}
		var je *Error
		if !errors.As(err, &je) || je.Field != tc.field {
			t.Errorf("%q: got %v, want an error on %s", tc.extra, err, tc.field)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error carries the secret: %v", tc.extra, err)
		}
	}
	j, err := Parse([]byte(good + "nats_auth: {user: u, password: hunter2-secret, tls_ca: ca.pem}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprintf("%v", j), fmt.Sprintf("%+v", j), fmt.Sprintf("%#v", j), fmt.Sprint(j.NATSAuth)} {
		if strings.Contains(s, "hunter2") {
			t.Fatalf("a printed job carries the password: %s", s)
		}
	}
	if got := j.NATSAuth.String(); got != "nats_auth{user,password,tls_ca}" {
		t.Errorf("String: %q", got)
	}
}
