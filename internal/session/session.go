package session

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// Header is the gRPC metadata key naming the caller's session.
const Header = "farmem-session"

// Options configure Dial. A plain value; the callbacks must be safe to call
// from the session goroutine.
type Options struct {
	// ClientID is the stable identity the session is opened under (required).
	ClientID string
	// ClientName is shown by memctl; at most pool.MaxNameLen (255) bytes,
	// or the daemon refuses the session with ErrInvalid.
	ClientName string
	// OnEvents receives the daemon's segment lost/restored notices; it runs
	// on the session goroutine and must not block.
	OnEvents func(*poolv1.SegmentEvents)
	// OnReclaimed receives the ids of the client's segments that the
	// daemon reclaimed because the client's lease ran out while it had no
	// session (Welcome.reclaimed); it runs on the session goroutine, before
	// Call hands out the new session, and must not block.
	OnReclaimed func(ids []uint64)
	// OnDown runs (on the session goroutine) when an established session
	// breaks, before it is re-established.
	OnDown func()
	// OnUp runs (on the session goroutine) each time a session is
	// established, the first time included.
	OnUp func(sessionID string)
	// MaxWait bounds how long Call waits for a session while the Conn
	// reconnects, when the caller's ctx has no deadline: a daemon that
	// stays away then fails calls with ErrUnavailable instead of holding
	// them forever. Default: 0, no bound beyond ctx.
	MaxWait time.Duration
	// TLS, when set, makes a "tcp" connection use mutual TLS with it (see
	// ChannelTLS). Default: nil (plaintext; the unix socket needs none).
	TLS *tls.Config
}

// Conn is a control-plane connection with a live session. It is safe for
// concurrent use.
type Conn struct {
	addr string
	opts Options
	conn *grpc.ClientConn
	api  poolv1.PoolClient

	mu       sync.Mutex
	session  string        // current session id; "" while reconnecting
	ready    chan struct{} // closed when session is set, replaced when it is lost
	node     string
	dataCred []byte // the current session's data-plane credential
	leaseTTL time.Duration
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// Dial connects to a daemon at addr over network ("unix" or "tcp") and
// waits, within ctx, for its first session.
func Dial(ctx context.Context, network, addr string, o Options) (*Conn, error) {
	conn, err := ChannelTLS(network, addr, o.TLS)
	if err != nil {
		return nil, err
	}
	c := &Conn{addr: addr, opts: o, conn: conn, api: poolv1.NewPoolClient(conn), ready: make(chan struct{}), stop: make(chan struct{})}
	first := make(chan error, 1)
	c.wg.Add(1)
	go c.loop(first)
	select {
	case err = <-first:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Channel is a gRPC channel to a daemon at addr over network ("unix" or
// "tcp"), without a session: what administrators (memctl) use. It connects
// lazily, on the first call.
func Channel(network, addr string) (*grpc.ClientConn, error) {
	return ChannelTLS(network, addr, nil)
}

// ChannelTLS is Channel with mutual TLS when tlsCfg is non-nil: the
// client presents tlsCfg's certificate and checks the daemon's against
// tlsCfg.RootCAs for the host in addr unless tlsCfg.ServerName names
// another. tlsCfg is not modified.
func ChannelTLS(network, addr string, tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		cfg := tlsCfg.Clone()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg.ServerName = host
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient("passthrough:///farmem",
		grpc.WithTransportCredentials(creds),
		// Reconnect fast: a restarted daemon gives its returning clients
		// only a lease TTL (plus a grace) to come back, and gRPC's default
		// backoff grows to minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("dial poold at %s: %w", addr, err)
	}
	return conn, nil
}

// API is the daemon's gRPC client; pass contexts from Call.
func (c *Conn) API() poolv1.PoolClient { return c.api }

// DataCredential is what the current session presents to the daemon's
// data plane (nil while reconnecting, or from a daemon that issues none).
func (c *Conn) DataCredential() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dataCred
}

// Addr is the daemon's address.
func (c *Conn) Addr() string { return c.addr }

// Node is the daemon's node name.
func (c *Conn) Node() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.node
}

// Call returns ctx carrying the current session, waiting within ctx (and
// Options.MaxWait when ctx has no deadline) while the session is being
// re-established.
func (c *Conn) Call(ctx context.Context) (context.Context, string, error) {
	var bound <-chan time.Time
	if _, ok := ctx.Deadline(); !ok && c.opts.MaxWait > 0 {
		t := time.NewTimer(c.opts.MaxWait)
		defer t.Stop()
		bound = t.C
	}
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, "", fmt.Errorf("session: %w", errs.ErrClosed)
		}
		sid, ready := c.session, c.ready
		c.mu.Unlock()
		if sid != "" {
			return metadata.AppendToOutgoingContext(ctx, Header, sid), sid, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, "", fmt.Errorf("waiting for poold at %s: %w (%w)", c.addr, ctx.Err(), errs.ErrUnavailable)
		case <-bound:
			return nil, "", fmt.Errorf("no session with poold at %s for %v: %w", c.addr, c.opts.MaxWait, errs.ErrUnavailable)
		}
	}
}

// loop keeps a session open, reopening it with backoff when the stream
// breaks. The first outcome goes to first.
func (c *Conn) loop(first chan<- error) {
	defer c.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		up := c.run(first)
		first = nil
		c.mu.Lock()
		if c.session != "" {
			c.session, c.dataCred = "", nil
			c.ready = make(chan struct{})
		}
		limit := min(2*time.Second, max(c.leaseTTL/4, 50*time.Millisecond))
		c.mu.Unlock()
		if up && c.opts.OnDown != nil {
			c.opts.OnDown()
		}
		if up {
			backoff = 50 * time.Millisecond
		}
		select {
		case <-c.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, limit)
	}
}

// run runs one session until its stream ends; it reports whether the
// session was established.
func (c *Conn) run(first chan<- error) (up bool) {
	report := func(err error) {
		if first != nil {
			first <- err
			first = nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	stream, err := c.api.Session(ctx)
	if err != nil {
		report(errs.FromStatus(err))
		return false
	}
	hello := &poolv1.SessionRequest{Msg: &poolv1.SessionRequest_Hello{Hello: &poolv1.Hello{
		ClientId: c.opts.ClientID, ClientName: c.opts.ClientName, Pid: int64(os.Getpid()),
	}}}
	if err := stream.Send(hello); err != nil {
		report(errs.FromStatus(err))
		return false
	}
	resp, err := stream.Recv()
	if err != nil {
		report(errs.FromStatus(err))
		return false
	}
	w := resp.GetWelcome()
	if w == nil {
		report(fmt.Errorf("%w: poold answered Hello without Welcome", errs.ErrUnavailable))
		return false
	}
	if len(w.Reclaimed) > 0 && c.opts.OnReclaimed != nil {
		c.opts.OnReclaimed(w.Reclaimed)
	}
	c.mu.Lock()
	c.session, c.node, c.leaseTTL = w.SessionId, w.Node, time.Duration(w.LeaseTtlMs)*time.Millisecond
	c.dataCred = w.DataCredential
	close(c.ready)
	period := max(c.leaseTTL/3, 100*time.Millisecond)
	c.mu.Unlock()
	report(nil)
	if c.opts.OnUp != nil {
		c.opts.OnUp(w.SessionId)
	}

	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if stream.Send(&poolv1.SessionRequest{Msg: &poolv1.SessionRequest_KeepAlive{KeepAlive: &poolv1.KeepAlive{}}}) != nil {
					return
				}
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return true
		}
		if ev := m.GetEvents(); ev != nil && c.opts.OnEvents != nil {
			c.opts.OnEvents(ev)
		}
	}
}

// Close ends the session and the channel; idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	close(c.stop)
	err := c.conn.Close()
	c.wg.Wait()
	return err
}
