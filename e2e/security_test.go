package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"cairn/internal/testutil/testbin"
	"cairn/internal/testutil/testpki"
)

// The security tests run the cairn binary against a nats-server process
// (built from the module) that requires credentials, each time through a
// SIGKILL and a restart, and check the wordcount outputs exactly.

// secureCase is one way a NATS server requires clients to authenticate.
type secureCase struct {
	// conf is the server configuration after listen and jetstream.
	conf string
	// scheme is the job's URL scheme: nats or tls.
	scheme string
	// auth is the job file's nats_auth block (YAML flow mapping).
	auth string
	// admin are the test's own connection options (streams, input, checks).
	admin []nats.Option
	// secrets must never appear in what cairn shows (logs, HTTP, store).
	secrets []string
	// createAll: the test creates every stream; otherwise only the input,
	// and cairn creates its output and dead-letter streams.
	createAll bool
	// https: the job's HTTP port serves TLS with this CA's certificate.
	https *testpki.CA
	// wrongAuth, when set, is a nats_auth block that must be refused at
	// start, with an error that says wrongWant and carries no secret.
	wrongAuth, wrongWant string
	// wantLog must appear in the job's log.
	wantLog []string
}

// startNATSConf runs nats-server with conf (listen and jetstream are
// added) and returns its port once the admin options connect.
func startNATSConf(t *testing.T, dir, conf string, admin []nats.Option, scheme string) int {
	t.Helper()
	bin, err := testbin.Build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	full := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n%s\n", port, filepath.Join(dir, "js"), conf)
	confFile := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(confFile, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", confFile)
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", log.String())
		}
	})
	url := fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	for deadline := time.Now().Add(20 * time.Second); ; {
		nc, err := nats.Connect(url, admin...)
		if err == nil {
			nc.Close()
			return port
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server did not accept the admin: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// secureJob is the wordcount job; its checkpoints are taken on demand.
const secureJob = `name: wordcount
nats: %s
nats_auth: %s
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 128
slots: 2
data_dir: %s
batch_size: 256
checkpoint: {interval: 1h}
`

// runSecure runs wordcount through one SIGKILL and a restart against the
// server of tc and checks every output exactly; then it looks for the
// secrets in everything cairn shows.
func runSecure(t *testing.T, dir string, port int, tc secureCase) {
	cairn, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("%s://127.0.0.1:%d", tc.scheme, port)
	nc, err := nats.Connect(url, tc.admin...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, js, "LINES", "lines.>")
	if tc.createAll {
		ctx := context.Background()
		for _, sc := range []jetstream.StreamConfig{
			{Name: "COUNTS", Subjects: []string{"counts.>"}, Storage: jetstream.FileStorage, AllowBatchPublish: true},
			{Name: "CAIRN_DLQ_WORDCOUNT", Subjects: []string{"cairn.dlq.wordcount"}, Storage: jetstream.FileStorage},
		} {
			if _, err := js.CreateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
		}
	}
	msgs, model := lineCorpus(16, 400, 1600)
	total := 0
	for _, n := range model {
		total += n
	}
	data := filepath.Join(dir, "data")
	jobFile := filepath.Join(dir, "job.yaml")
	writeJob := func(auth string) {
		if err := os.WriteFile(jobFile, fmt.Appendf(nil, secureJob, url, auth, data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	tokenFile := filepath.Join(dir, "http-token")
	httpToken := "http-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.WriteFile(tokenFile, []byte(httpToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := append([]string{httpToken}, tc.secrets...)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := []string{"run", "--job", jobFile, "--http", httpAddr, "--http-token-file", tokenFile}
	httpBase, client := "http://"+httpAddr, http.DefaultClient
	if tc.https != nil {
		cert, key := tc.https.Server("cairn-http")
		args = append(args, "--http-tls-cert", cert, "--http-tls-key", key)
		httpBase = "https://" + httpAddr
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tc.https.Pool()}}}
	}
	start := func() (*exec.Cmd, chan error) {
		cmd := exec.Command(cairn, args...)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	outputs := func() int {
		s, err := js.Stream(context.Background(), "COUNTS")
		if err != nil {
			return 0
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return 0
		}
		return int(info.State.Msgs)
	}
	waitFor := func(what string, done chan error, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(45 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			select {
			case err := <-done:
				t.Fatalf("cairn exited while waiting for %s: %v\n%s", what, err, logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, logs.String())
			}
		}
	}

	if tc.wrongAuth != "" {
		writeJob(tc.wrongAuth)
		var out syncBuffer
		cmd := exec.Command(cairn, "run", "--job", jobFile, "--http", "off")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err == nil {
			t.Fatalf("cairn started with wrong credentials\n%s", out.String())
		}
		if !strings.Contains(out.String(), tc.wrongWant) {
			t.Errorf("wrong credentials: the error does not say %q:\n%s", tc.wrongWant, out.String())
		}
		noSecrets(t, "the error of a refused start", out.String(), secrets)
		if testing.Verbose() {
			t.Logf("refused start:\n%s", out.String())
		}
		if err := os.RemoveAll(data); err != nil {
			t.Fatal(err)
		}
	}
	writeJob(tc.auth)

	// Three parts: the first is covered by a checkpoint taken through the
	// HTTP action (with the token); the second is processed and published
	// after it, then the job is SIGKILLed, so the restart replays it and
	// must skip every output it already published; the third arrives while
	// the job is down.
	parts := [][]*nats.Msg{msgs[:len(msgs)*2/5], msgs[len(msgs)*2/5 : len(msgs)*7/10], msgs[len(msgs)*7/10:]}
	upTo := func(k int) int {
		n := 0
		for _, p := range parts[:k] {
			for _, m := range p {
				n += len(splitWords(string(m.Data)))
			}
		}
		return n
	}
	publishAll(t, js, parts[0])
	cmd, done := start()
	waitFor("the first part's outputs", done, func() bool { return outputs() >= upTo(1) })
	req, _ := http.NewRequest(http.MethodPost, httpBase+"/api/action/checkpoint", nil)
	req.Header.Set("Authorization", "Bearer "+httpToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "committed") {
		t.Fatalf("checkpoint action: %d %s", resp.StatusCode, body)
	}
	publishAll(t, js, parts[1])
	waitFor("the second part's outputs", done, func() bool { return outputs() >= upTo(2) })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	publishAll(t, js, parts[2])
	cmd, done = start()
	waitFor("every output", done, func() bool { return outputs() >= total })

	// What the running job shows, read with the token.
	var shown strings.Builder
	for _, path := range []string{"/", "/metrics", "/api/snapshot", "/api/stats", "/healthz"} {
		req, _ := http.NewRequest(http.MethodGet, httpBase+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, resp.StatusCode)
		}
		req.Header.Set("Authorization", "Bearer "+httpToken)
		if resp, err = client.Do(req); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the token: %d %s", path, resp.StatusCode, b)
		}
		shown.Write(b)
	}
	noSecrets(t, "the HTTP endpoints", shown.String(), secrets)
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)); err == nil {
		noSecrets(t, "the command line", string(b), secrets)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cairn exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("cairn did not stop after SIGTERM\n%s", logs.String())
	}
	if want := fmt.Sprintf("source_seq=%d", len(parts[0])); !regexp.MustCompile(`restore complete" checkpoint=\d+ .*` + want + `\b`).MatchString(logs.String()) {
		t.Errorf("the restart did not restore the checkpoint at %s:\n%s", want, logs.String())
	}
	for _, want := range tc.wantLog {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	noSecrets(t, "the log", logs.String(), secrets)
	if testing.Verbose() {
		t.Logf("cairn log:\n%s", logs.String())
	}
	// Manifests and everything else the store holds.
	_ = filepath.Walk(filepath.Join(data, "store"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			noSecrets(t, p, string(b), secrets)
		}
		return nil
	})
	checkOutputs(t, js, "COUNTS", "counts", 128, model)
}

func noSecrets(t *testing.T, where, text string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s carries a secret (%.4s...)", where, s)
		}
	}
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNATSUserPassword: user and password (from password_file), the HTTP
// port over TLS with a token from a file; a wrong password is refused at
// start with an error that quotes no password.
func TestNATSUserPassword(t *testing.T) {
	dir := t.TempDir()
	const pw, adminPW = "cairn-pw-7c1d9e2a55", "admin-pw-0b8e77f3c1"
	writeFile(t, filepath.Join(dir, "password"), pw+"\n")
	writeFile(t, filepath.Join(dir, "wrong"), "wrong-pw-31f0aa98\n")
	tc := secureCase{
		conf:      fmt.Sprintf("authorization { users = [ {user: cairn, password: %q}, {user: admin, password: %q} ] }", pw, adminPW),
		scheme:    "nats",
		auth:      "{user: cairn, password_file: password}",
		wrongAuth: "{user: cairn, password_file: wrong}",
		wrongWant: "Authorization Violation: the server refused the credentials of the job's nats_auth{user,password_file}",
		admin:     []nats.Option{nats.UserInfo("admin", adminPW)},
		secrets:   []string{pw, adminPW, "wrong-pw-31f0aa98"},
		https:     testpki.NewCA(t, dir),
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}

// TestNATSToken: a token from token_file.
func TestNATSToken(t *testing.T) {
	dir := t.TempDir()
	const tok = "nats-token-5d0c3b9f1e"
	writeFile(t, filepath.Join(dir, "token"), tok)
	tc := secureCase{
		conf:    fmt.Sprintf("authorization { token: %q }", tok),
		scheme:  "nats",
		auth:    "{token_file: token}",
		admin:   []nats.Option{nats.Token(tok)},
		secrets: []string{tok},
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}

// TestNATSNKey: an nkey user; the job reads the seed from nkey_file.
func TestNATSNKey(t *testing.T) {
	dir := t.TempDir()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	writeFile(t, filepath.Join(dir, "cairn.nk"), string(seed)+"\n")
	other, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	otherSeed, _ := other.Seed()
	writeFile(t, filepath.Join(dir, "other.nk"), string(otherSeed)+"\n")
	const adminPW = "admin-pw-aa41c09e77"
	tc := secureCase{
		conf:      fmt.Sprintf("authorization { users = [ {nkey: %s}, {user: admin, password: %q} ] }", pub, adminPW),
		scheme:    "nats",
		auth:      "{nkey_file: cairn.nk}",
		wrongAuth: "{nkey_file: other.nk}", // a valid seed the server does not know
		wrongWant: "Authorization Violation",
		admin:     []nats.Option{nats.UserInfo("admin", adminPW)},
		secrets:   []string{string(seed), string(otherSeed), adminPW},
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}

// TestNATSCreds: decentralized auth: an operator, a system account and an
// account with JetStream, set up in the test with nats-io/jwt and nkeys;
// the job's user connects with a creds file (its JWT and seed).
func TestNATSCreds(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	op, err := nkeys.CreateOperator()
	must(err)
	opPub, _ := op.PublicKey()
	sys, err := nkeys.CreateAccount()
	must(err)
	sysPub, _ := sys.PublicKey()
	acc, err := nkeys.CreateAccount()
	must(err)
	accPub, _ := acc.PublicKey()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "cairn-test"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(op)
	must(err)
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(op)
	must(err)
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "APP"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(op)
	must(err)
	user := func(name string) (string, []byte) {
		kp, err := nkeys.CreateUser()
		must(err)
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		uc := jwt.NewUserClaims(pub)
		uc.Name = name
		ujwt, err := uc.Encode(acc)
		must(err)
		return ujwt, seed
	}
	cairnJWT, cairnSeed := user("cairn")
	creds, err := jwt.FormatUserConfig(cairnJWT, cairnSeed)
	must(err)
	writeFile(t, filepath.Join(dir, "cairn.creds"), string(creds))
	adminJWT, adminSeed := user("admin")
	conf := fmt.Sprintf("operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: { %s: %q, %s: %q }\n",
		opJWT, sysPub, sysPub, sysJWT, accPub, accJWT)
	tc := secureCase{
		conf:    conf,
		scheme:  "nats",
		auth:    "{creds_file: cairn.creds}",
		admin:   []nats.Option{nats.UserJWTAndSeed(adminJWT, string(adminSeed))},
		secrets: []string{string(cairnSeed), string(adminSeed)},
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}

// TestNATSTLS: the server speaks only TLS, with a certificate from a CA
// the test made; the job trusts that CA (tls_ca) on a tls:// URL.
func TestNATSTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir)
	cert, key := ca.Server("nats")
	tc := secureCase{
		conf:   fmt.Sprintf("tls { cert_file: %q, key_file: %q }", cert, key),
		scheme: "tls",
		auth:   "{tls_ca: ca.pem}",
		admin:  []nats.Option{nats.RootCAs(ca.CertFile)},
		// Without the CA the server's certificate is not trusted.
		wrongAuth: "{}",
		wrongWant: "set nats_auth.tls_ca",
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}

// TestNATSMutualTLS: the server also requires a client certificate signed
// by its CA (verify: true); the job presents one (tls_cert, tls_key).
func TestNATSMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir)
	cert, key := ca.Server("nats")
	ccert, ckey := ca.Client("cairn")
	acert, akey := ca.Client("admin")
	tc := secureCase{
		conf:   fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }", cert, key, ca.CertFile),
		scheme: "tls",
		auth:   fmt.Sprintf("{tls_ca: ca.pem, tls_cert: %s, tls_key: %s}", filepath.Base(ccert), filepath.Base(ckey)),
		admin:  []nats.Option{nats.RootCAs(ca.CertFile), nats.ClientCert(acert, akey)},
		// Without a client certificate the server refuses.
		wrongAuth: "{tls_ca: ca.pem}",
		wrongWant: "nats: connect tls://",
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}

// permissionBlock is the least-privilege block of docs/SECURITY.md, as
// written there: the test runs with exactly what the document says.
func permissionBlock(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- permissions: tested by e2e/security_test.go -->\\s*```[a-z]*\\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/SECURITY.md has no permission block after its marker")
	}
	return string(m[1])
}

// TestNATSLeastPrivilege: the job's user has exactly the permissions of
// docs/SECURITY.md and nothing else; the input stream belongs to the
// producer (created by the admin) and does not capture the tick subject,
// which cairn may not add: it warns and goes on.
func TestNATSLeastPrivilege(t *testing.T) {
	// Mostly waiting on processes and servers: run beside another.
	t.Parallel()
	dir := t.TempDir()
	const pw, adminPW = "cairn-pw-e91b0c44d2", "admin-pw-5a7f2c90b3"
	writeFile(t, filepath.Join(dir, "password"), pw)
	conf := permissionBlock(t) + fmt.Sprintf("\nauthorization { users = [ {user: cairn, password: %q, permissions: $CAIRN_WORDCOUNT}, {user: admin, password: %q} ] }\n", pw, adminPW)
	tc := secureCase{
		conf:    conf,
		scheme:  "nats",
		auth:    "{user: cairn, password_file: password}",
		admin:   []nats.Option{nats.UserInfo("admin", adminPW)},
		secrets: []string{pw, adminPW},
		wantLog: []string{"input stream does not take processing-time ticks"},
	}
	port := startNATSConf(t, dir, tc.conf, tc.admin, tc.scheme)
	runSecure(t, dir, port, tc)
}
