package tcp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"time"
)

// ServerConfig configures a Server. Start from DefaultConfig; a zero field
// takes its default. It is a plain value; the Server keeps a copy.
type ServerConfig struct {
	// Authenticate checks the credential a client presents in its hello
	// (at most MaxCredential bytes). A non-nil error rejects the connection
	// with reason "auth failed". Nil accepts every client: only for tests and
	// single-host development. It may be called concurrently.
	// Default: nil.
	Authenticate func(cred []byte) error

	// Identify, when set, is called instead of Authenticate: it checks the
	// hello's credential together with the client certificate the TLS
	// session verified (nil without TLS, or when the client presented
	// none; ask for one with TLS.ClientAuth tls.VerifyClientCertIfGiven)
	// and names the principal the connection acts for, and the tenant of
	// that credential (see Tenant; "": the principal is its own): the
	// connection's session counts against that tenant's share however the
	// credential fares later, and Server.Disconnect tells the holders of
	// a principal apart by it. Segments given a principal set
	// (Server.Allow) serve only connections whose principal is in it. A
	// non-nil error rejects the connection with AUTH_FAILED. It may be
	// called concurrently. Default: nil.
	Identify func(cred []byte, cert *x509.Certificate) (principal, tenant string, err error)

	// Forwarders, when set, says which principals (as Identify named the
	// connection's) may send forwarded ops (request flag FORWARD): a
	// primary home's copies of its clients' writes, whose origin block
	// names the client's session and the answer the reply cache keeps for
	// it. Any other connection's forwarded op is answered ACCESS_DENIED
	// unapplied: an origin block names another session's slot, which a
	// tenant must not fill with an answer (its own op would then be
	// answered from the cache, never applied) nor lock. Nil accepts them
	// from every connection: only for tests and single-host development.
	// It may be called concurrently. Default: nil.
	Forwarders func(principal string) bool

	// Tenant, when set, names the tenant a principal acts for when an
	// origin block names it as a forwarded op's client (Identify names a
	// connection's own): the sessions of every principal of one tenant
	// share one fair share of the reply cache (MaxSessions), so an
	// identity that holds many principals (poold: one per client id it
	// opened a session with) cannot push the others' sessions out by
	// spreading its own over them. "" or nil: each principal is its own
	// tenant. It is called when an op forwarded by a primary opens a
	// session, with that segment's forwarding lock held: it must answer
	// without blocking. It may be called concurrently. Default: nil.
	Tenant func(principal string) string

	// TLS, when set, makes every connection run a TLS handshake with it
	// before the hello (bounded by HandshakeTimeout), and carries the
	// protocol over TLS from then on: the credential, keys and data are
	// then neither readable nor replayable on the wire. It should have
	// MinVersion tls.VersionTLS13; clients dial with WithTLS. BusyPoll
	// works under it: the socket is polled, records decrypted as they
	// arrive. Connections refused at accept are reset without the busy
	// reply. Default: nil (plaintext).
	TLS *tls.Config

	// MaxInflightPerConn is the most responses one connection holds before
	// they are flushed to the socket in one vectored write. Responses are
	// also flushed whenever the connection has no further complete request
	// buffered. Each unflushed READ response pins its segment (Revoke waits).
	// Unit: responses. Default: 64. Range 1..4096.
	MaxInflightPerConn int

	// MaxConns is the most client connections open at once, counting
	// those still in their handshake. It is checked when a connection is
	// accepted: one over it is answered "busy" and closed at once, before
	// anything is allocated for it. Unit: connections. Default: 4096.
	MaxConns int

	// MaxHandshakes is the most connections still in their handshake (hello
	// not yet answered) at once, from all sources; one over it is refused
	// as over MaxConns. A handshake holds its slot for one round trip, or
	// for up to HandshakeTimeout when the client sends nothing. Unit:
	// connections. Default: 1024.
	MaxHandshakes int

	// MaxHandshakesPerSource is the most connections in their handshake at
	// once from one source address (one IPv4 address, or one IPv6 /64),
	// so that a flood from one host cannot take the slots of MaxHandshakes
	// from every other. Clients behind one NAT share it, but each holds a
	// slot only for the round trip of its hello: it binds only when that
	// many of them dial within the same round trip. Unit: connections.
	// Default: 64.
	MaxHandshakesPerSource int

	// MaxConnsPerTenant is the most authenticated connections of one
	// tenant (Tenant: an identity's client ids together; a principal
	// without one counts alone) once half of MaxConns are open, so that a
	// client with a valid credential cannot hold every one of MaxConns
	// and lock out the others. One over it is answered "busy" after its
	// hello. Unit: connections. Default: a quarter of MaxConns.
	MaxConnsPerTenant int

	// MaxSessions is the most client sessions whose exactly-once replies
	// the server caches (protocol version 2): each holds the last answer of
	// its rdma.SessionSlots slots, about 4 KiB. Opening one more evicts the
	// least recently used; that client's retries of operations whose
	// answers were lost then get INDETERMINATE (rdma.ErrIndeterminate),
	// never a second application. While a tenant (Tenant; else a
	// principal, or a credential) holds more than a sixteenth of the table
	// (at least 4), the evicted one is its least recently used instead, so
	// a client that opens session after session, under one principal or
	// many of one tenant, does not push the others out. Unit: sessions.
	// Default: 1024.
	MaxSessions int

	// HandshakeTimeout bounds the hello/reply exchange of a new connection.
	// Default: 5s.
	HandshakeTimeout time.Duration

	// FrameTimeout bounds how long an authenticated connection takes to
	// deliver one request frame (header and payload) once its first byte
	// has arrived; a client that stalls mid-frame is disconnected. Idle
	// time between frames is not limited. Default: 10s.
	FrameTimeout time.Duration

	// WriteTimeout bounds one flush of responses; a client that stops
	// reading for longer is disconnected. It also bounds how long such a
	// client can delay Revoke. The deadline is renewed only when half of it
	// is used up (a timer update per flush costs more than a small flush),
	// so a stalled flush is cut after between WriteTimeout/2 and
	// WriteTimeout. Default: 10s.
	WriteTimeout time.Duration

	// ReadBufferSize is the per-connection buffer for request headers and
	// small payloads, in bytes. Default: 64 KiB. Minimum: 4 KiB.
	ReadBufferSize int

	// BusyPoll is how long a connection's goroutine busy-polls its socket
	// for the next request before parking in the network poller: at one
	// request in flight the next one usually comes within it, and is then
	// read without the sleep and wake-up (two context switches) that
	// parking costs. It spends that CPU time polling, and backs off on a
	// connection whose requests keep not coming within it; at most half
	// the cores (GOMAXPROCS/2, at least one) poll at once. Deadlines and
	// closes take effect when a poll ends. Default: DefaultBusyPoll
	// (50µs); negative: off (zero takes the default, as every field here).
	BusyPoll time.Duration

	// Logger receives connection-level events (refused connections and
	// handshakes, malformed frames). Refusals are sampled: at most one
	// warning per second per Refusal, saying how many were not logged
	// since. Default: slog.Default().
	Logger *slog.Logger

	// Refused, when set, is called once per connection refused before or
	// during its handshake, with the reason, for metrics. It must be quick
	// and must not block; the accept loop and connection goroutines call
	// it concurrently. Default: nil (off).
	Refused func(Refusal)

	// Observe, when set, is called once per operation whose response is
	// queued, on the connection's goroutine, for metrics. It must be quick
	// and must not block; several connections call it concurrently. The
	// server reads the clock for it only when it is set. Default: nil (off).
	Observe func(Observation)

	// Message, when set, serves MSG requests (opcode 5): it gets the
	// request (MessageCall) and ctx, which ends when the server closes; it
	// returns the response payload, at most MessageCall.MaxResp bytes. It
	// runs on the connection's goroutine and may block (a long poll): that
	// connection serves nothing else meanwhile, so clients keep blocking
	// calls on a connection of their own. An error is answered with the
	// status of the rdma sentinel it wraps. Default: nil (MSG is answered
	// UNSUPPORTED).
	Message func(ctx context.Context, m MessageCall) ([]byte, error)

	// ForwardTimeout is how long a forwarding segment (Server.Forward)
	// waits on a target that answers nothing: a target with forwarded
	// ops waiting on it (for an exactly-once slot of its Client's
	// session, a connection slot, or their acknowledgements, retries
	// after broken connections included) that has read no response on
	// any connection of its Client for ForwardTimeout plus a second per
	// 4 MiB of forwarded bytes waiting on it is reported to
	// Forwarding.OnFail and skipped from then on. The deadline measures
	// silence, not total time: a large write, or many small ones queued
	// for the session's slots, is waited for as long as the target keeps
	// answering; one that stops is declared failed at most ForwardTimeout
	// and an eighth of it, plus those bytes' allowance, after the later
	// of its last answer and the op's start (its watch checks sixteen
	// times per ForwardTimeout). An op given up on is not withdrawn:
	// having left, it may still reach the target later, so whoever
	// rewrites a target's bytes while its loss is not recorded raises its
	// epoch first (Server.SetEpoch there), and the late op, which carries
	// the old one, is refused. Default: 1s.
	ForwardTimeout time.Duration
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() ServerConfig {
	return ServerConfig{
		MaxInflightPerConn:     64,
		MaxConns:               4096,
		MaxHandshakes:          1024,
		MaxHandshakesPerSource: 64,
		FrameTimeout:           10 * time.Second,
		MaxSessions:            1024,
		HandshakeTimeout:       5 * time.Second,
		WriteTimeout:           10 * time.Second,
		ReadBufferSize:         64 << 10,
		BusyPoll:               DefaultBusyPoll,
		ForwardTimeout:         time.Second,
		Logger:                 slog.Default(),
	}
}

// withDefaults returns c with every zero field replaced by its default.
func (c ServerConfig) withDefaults() ServerConfig {
	d := DefaultConfig()
	orDefault(&c.MaxInflightPerConn, d.MaxInflightPerConn)
	orDefault(&c.MaxConns, d.MaxConns)
	orDefault(&c.MaxHandshakes, d.MaxHandshakes)
	orDefault(&c.MaxHandshakesPerSource, d.MaxHandshakesPerSource)
	orDefault(&c.MaxConnsPerTenant, max(1, c.MaxConns/4))
	orDefault(&c.FrameTimeout, d.FrameTimeout)
	orDefault(&c.MaxSessions, d.MaxSessions)
	orDefault(&c.HandshakeTimeout, d.HandshakeTimeout)
	orDefault(&c.WriteTimeout, d.WriteTimeout)
	orDefault(&c.ReadBufferSize, d.ReadBufferSize)
	orDefault(&c.BusyPoll, d.BusyPoll)
	orDefault(&c.ForwardTimeout, d.ForwardTimeout)
	orDefault(&c.Logger, d.Logger)
	return c
}

// orDefault sets *v to d when *v is its type's zero value.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Validate reports the first field that is out of range (zero fields are
// valid: they take their defaults).
func (c ServerConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.MaxInflightPerConn < 1 || c.MaxInflightPerConn > 4096:
		return fmt.Errorf("rdma/tcp: ServerConfig.MaxInflightPerConn is %d; use 1..4096 (default 64)", c.MaxInflightPerConn)
	case c.MaxConns < 1:
		return fmt.Errorf("rdma/tcp: ServerConfig.MaxConns is %d; use a positive count (default 4096)", c.MaxConns)
	case c.MaxHandshakes < 1:
		return fmt.Errorf("rdma/tcp: ServerConfig.MaxHandshakes is %d; use a positive count (default 1024)", c.MaxHandshakes)
	case c.MaxHandshakesPerSource < 1:
		return fmt.Errorf("rdma/tcp: ServerConfig.MaxHandshakesPerSource is %d; use a positive count (default 64)", c.MaxHandshakesPerSource)
	case c.MaxConnsPerTenant < 1:
		return fmt.Errorf("rdma/tcp: ServerConfig.MaxConnsPerTenant is %d; use a positive count (default a quarter of MaxConns)", c.MaxConnsPerTenant)
	case c.FrameTimeout < 0:
		return fmt.Errorf("rdma/tcp: ServerConfig.FrameTimeout is %v; use a positive duration (default 10s)", c.FrameTimeout)
	case c.MaxSessions < 1:
		return fmt.Errorf("rdma/tcp: ServerConfig.MaxSessions is %d; use a positive count (default 1024)", c.MaxSessions)
	case c.HandshakeTimeout < 0:
		return fmt.Errorf("rdma/tcp: ServerConfig.HandshakeTimeout is %v; use a positive duration (default 5s)", c.HandshakeTimeout)
	case c.WriteTimeout < 0:
		return fmt.Errorf("rdma/tcp: ServerConfig.WriteTimeout is %v; use a positive duration (default 10s)", c.WriteTimeout)
	case c.ForwardTimeout < 0:
		return fmt.Errorf("rdma/tcp: ServerConfig.ForwardTimeout is %v; use a positive duration (default 1s)", c.ForwardTimeout)
	case c.ReadBufferSize < 4<<10:
		return fmt.Errorf("rdma/tcp: ServerConfig.ReadBufferSize is %d bytes; use at least 4096 (default 65536)", c.ReadBufferSize)
	}
	return nil
}
