package dashboard

import (
	"fmt"
	"net"
	"strings"
)

// InsecureAddrError is returned by Listen for an address that is not loopback when no
// token is set: anyone who can reach the port could trigger actions.
type InsecureAddrError struct {
	Addr string
}

// Error says what was refused and what to do instead.
func (e *InsecureAddrError) Error() string {
	return fmt.Sprintf("dashboard: refusing to listen on %q without a token: it is reachable from other machines; "+
		"pass --http-token-file FILE or set CAIRN_HTTP_TOKEN (every request then needs \"Authorization: Bearer TOKEN\"), or listen on 127.0.0.1", e.Addr)
}

// Listen listens on the TCP address addr for Handler. Without a token it accepts only a
// loopback address (127.0.0.1:PORT, [::1]:PORT, localhost:PORT) and returns an
// *InsecureAddrError for anything else, including an empty host (":8080", all
// interfaces) and host names, which may resolve to more than loopback.
func Listen(addr, token string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dashboard: listen %q: %w (want HOST:PORT, e.g. 127.0.0.1:8080)", addr, err)
	}
	if token == "" && !loopbackHost(host) {
		return nil, &InsecureAddrError{Addr: addr}
	}
	if strings.EqualFold(host, "localhost") {
		// "localhost" could resolve to a non-loopback address on a broken host; bind the
		// loopback address itself.
		addr = net.JoinHostPort("127.0.0.1", addr[strings.LastIndexByte(addr, ':')+1:])
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dashboard: listen %s: %w", addr, err)
	}
	return ln, nil
}
