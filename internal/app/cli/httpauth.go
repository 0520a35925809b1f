package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"

	"cairn/internal/app/dashboard"
	"cairn/internal/app/runtime"
)

// EnvHTTPToken is the environment variable the HTTP token may come from.
const EnvHTTPToken = "CAIRN_HTTP_TOKEN"

// httpFlags are the HTTP port's security flags of `cairn run`.
type httpFlags struct {
	token      string // --http-token: on the command line, visible in ps; warned about
	tokenFile  string
	tlsCert    string
	tlsKey     string
	publicRead bool
}

func addHTTPFlags(fs *flag.FlagSet) *httpFlags {
	f := &httpFlags{}
	fs.StringVar(&f.tokenFile, "http-token-file", "", "file holding the HTTP token (or set "+EnvHTTPToken+"); with a token every endpoint needs it, as \"Authorization: Bearer TOKEN\"")
	fs.StringVar(&f.token, "http-token", "", "the HTTP token on the command line: visible to every user of the machine (ps); prefer --http-token-file or "+EnvHTTPToken)
	fs.StringVar(&f.tlsCert, "http-tls-cert", "", "serve HTTPS with this certificate (PEM; with --http-tls-key)")
	fs.StringVar(&f.tlsKey, "http-tls-key", "", "the private key of --http-tls-cert (PEM)")
	fs.BoolVar(&f.publicRead, "http-public-read", false, "with a token: let GET requests (dashboard, /metrics, JSON) through without it; actions still need it")
	return f
}

// httpToken picks the HTTP token: --http-token-file, else --http-token
// (with a warning: the command line is public on the machine), else
// $CAIRN_HTTP_TOKEN. Giving it two ways on the command line is refused.
func httpToken(tokenFlag, tokenFile string, log *slog.Logger) (string, error) {
	if tokenFlag != "" && tokenFile != "" {
		return "", errors.New("give the HTTP token once: --http-token-file or --http-token, not both")
	}
	if tokenFile != "" {
		tok, err := runtime.ReadSecretFile(tokenFile)
		if err != nil {
			return "", fmt.Errorf("--http-token-file: %w", err)
		}
		return tok, nil
	}
	if tokenFlag != "" {
		log.Warn("--http-token puts the token on the command line, where every user of this machine can read it (ps, /proc/PID/cmdline); use --http-token-file FILE or " + EnvHTTPToken)
		return tokenFlag, nil
	}
	return os.Getenv(EnvHTTPToken), nil
}

// access resolves the token and checks the flags; call before listening.
func (f *httpFlags) access(log *slog.Logger) (dashboard.Access, error) {
	tok, err := httpToken(f.token, f.tokenFile, log)
	if err != nil {
		return dashboard.Access{}, err
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return dashboard.Access{}, errors.New("--http-tls-cert and --http-tls-key go together")
	}
	if f.publicRead && tok == "" {
		return dashboard.Access{}, errors.New("--http-public-read needs a token (--http-token-file or " + EnvHTTPToken + "): without one everything is open to whoever reaches the port")
	}
	if tok != "" && len(tok) < 16 {
		log.Warn("the HTTP token is short; use at least 16 random characters (for example: openssl rand -hex 16)", "length", len(tok))
	}
	return dashboard.Access{Token: tok, PublicRead: f.publicRead}, nil
}

// listen is dashboard.Listen (loopback only without a token) with TLS when
// asked. A token without TLS on a port other machines reach travels in
// clear text: that is allowed (a private network) but said.
func (f *httpFlags) listen(addr string, a dashboard.Access, log *slog.Logger) (net.Listener, error) {
	ln, err := dashboard.Listen(addr, a.Token)
	if err != nil {
		return nil, err
	}
	if f.tlsCert == "" {
		if host, _, _ := net.SplitHostPort(addr); a.Token != "" && !loopbackAddr(host) {
			log.Warn("the HTTP port is reachable from other machines without TLS: the token and the data travel in clear text; add --http-tls-cert and --http-tls-key", "addr", addr)
		}
		return ln, nil
	}
	tln, err := dashboard.TLSListener(ln, f.tlsCert, f.tlsKey)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return tln, nil
}

func loopbackAddr(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
