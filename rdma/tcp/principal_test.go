package tcp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/rdma"
)

// namedCreds is an Identify that takes the credential for the principal's
// name, as tests' stand-in for poold's credential table.
func namedCreds(cred []byte, _ *x509.Certificate) (string, string, error) {
	if len(cred) == 0 {
		return "", "", errors.New("no credential")
	}
	return string(cred), "", nil
}

// TestAllowPrincipals: a segment given a principal set serves only
// connections whose principal is in it, also with the right key; a new
// set takes effect on a connection's next request (the connection's
// cache of its last check does not outlive it); a segment given no set
// serves every connection.
func TestAllowPrincipals(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		cfg.Identify = namedCreds
		s := startServer(t, cfg)
		_, r := s.export(t, 1, 4096)
		_, open := s.export(t, 2, 4096)
		require.NoError(t, s.Allow(1, []string{"alice"}))
		alice := dial(t, s.addr, append(opts, WithCredential([]byte("alice")))...)
		bob := dial(t, s.addr, append(opts, WithCredential([]byte("bob")))...)
		ctx := t.Context()
		buf := make([]byte, 8)

		require.NoError(t, alice.Write(ctx, r, 0, []byte("alice's!")))
		require.ErrorIs(t, bob.Read(ctx, r, 0, buf), rdma.ErrAccessDenied)
		require.ErrorIs(t, bob.Write(ctx, r, 0, []byte("bob was!")), rdma.ErrAccessDenied)
		_, _, err := bob.CompareAndSwap64(ctx, r, 0, 0, 1)
		require.ErrorIs(t, err, rdma.ErrAccessDenied)
		require.NoError(t, alice.Read(ctx, r, 0, buf))
		require.Equal(t, "alice's!", string(buf))

		require.NoError(t, s.Allow(1, []string{"bob"}))
		require.ErrorIs(t, alice.Read(ctx, r, 0, buf), rdma.ErrAccessDenied)
		require.NoError(t, bob.Read(ctx, r, 0, buf))

		require.NoError(t, alice.Read(ctx, open, 0, buf))
		require.NoError(t, bob.Read(ctx, open, 0, buf))
		require.ErrorIs(t, s.Allow(3, nil), rdma.ErrNotExported)
	})
}

// TestIdentifySeesClientCertificate: over TLS with client certificates
// asked for, Identify gets the certificate the client presented (nil when
// it presented none), so the caller can bind a credential to it.
func TestIdentifySeesClientCertificate(t *testing.T) {
	srv, cli := tlsConfigs(t)
	withCert, roots := clientCert(t, "app")
	srv = srv.Clone()
	srv.ClientAuth, srv.ClientCAs = tls.VerifyClientCertIfGiven, roots
	var mu sync.Mutex
	seen := map[string]bool{} // the common names Identify got ("none": no certificate)
	s := startServer(t, ServerConfig{TLS: srv, Identify: func(cred []byte, cert *x509.Certificate) (string, string, error) {
		name := "none"
		if cert != nil {
			name = cert.Subject.CommonName
		}
		mu.Lock()
		seen[name] = true
		mu.Unlock()
		if name != "none" && name != string(cred) {
			return "", "", fmt.Errorf("credential of %s over a certificate of %s", cred, name)
		}
		return string(cred), "", nil
	}})
	saw := func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
	dial(t, s.addr, WithTLS(cli), WithCredential([]byte("app")))
	require.Equal(t, map[string]bool{"none": true}, saw())
	cc := cli.Clone()
	cc.Certificates = withCert.Certificates
	dial(t, s.addr, WithTLS(cc), WithCredential([]byte("app")))
	require.Equal(t, map[string]bool{"none": true, "app": true}, saw())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := Dial(ctx, s.addr, WithTLS(cc), WithCredential([]byte("mallory")))
	require.ErrorIs(t, err, rdma.ErrAccessDenied)
}

// clientCert is a client certificate for name of the test's CA (the one
// tlsConfigs uses), and that CA as a pool.
func clientCert(tb testing.TB, name string) (*tls.Config, *x509.CertPool) {
	tb.Helper()
	c, err := certs.ForTest(tb, name, false).Client()
	require.NoError(tb, err)
	return c, c.RootCAs
}

// BenchmarkPrincipalCost measures 4 KiB reads on a segment given a
// principal set (Identify and Allow, as poold serves every segment) beside
// one without (the key alone), in the same run, each round on both in
// turn: p50 at one in flight and reads/s at 16 in flight, as ratios
// checked/unchecked (medians of the rounds' ratios; run with
// -benchtime=5x or more).
func BenchmarkPrincipalCost(b *testing.B) {
	sides := make([]costSide, 2) // unchecked, checked
	for i, cfg := range []ServerConfig{{}, {Identify: namedCreds}} {
		s := startServer(b, cfg)
		_, r := s.export(b, 1, 64<<20)
		if cfg.Identify != nil {
			require.NoError(b, s.Allow(1, []string{"owner", "attacher-1", "attacher-2"}))
		}
		sides[i] = costSide{c: dial(b, s.addr, WithCredential([]byte("attacher-2"))), r: r}
	}
	lat, rate, _ := costRounds(b, sides, nil)
	ratio := medianRatio
	b.ReportMetric(median(lat[0]), "key-only-p50-ns")
	b.ReportMetric(median(lat[1]), "checked-p50-ns")
	b.ReportMetric(ratio(lat), "p50-ratio")
	b.ReportMetric(ratio(rate), "rate-ratio")
}

// liveCreds is an Identify over a set of credentials the test withdraws
// (each names its principal), as poold's table of live ones; hold, when
// set, runs inside Identify after the credential was found live.
type liveCreds struct {
	mu   sync.Mutex
	live map[string]bool
	hold func()
}

func (l *liveCreds) identify(cred []byte, _ *x509.Certificate) (string, string, error) {
	l.mu.Lock()
	ok, hold := l.live[string(cred)], l.hold
	l.mu.Unlock()
	if !ok {
		return "", "", fmt.Errorf("credential %q withdrawn", cred)
	}
	if hold != nil {
		hold()
	}
	return string(cred), "", nil
}

func (l *liveCreds) withdraw(cred string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.live, cred)
}

// TestDisconnectPrincipal: Disconnect closes every connection of one
// principal, whose operations then fail, and leaves the others serving; a
// redial with the withdrawn credential is refused. A hello whose
// credential Identify accepted just before it was withdrawn, and whose
// connection the Disconnect could not see yet, is refused too: it is
// checked again.
func TestDisconnectPrincipal(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		creds := &liveCreds{live: map[string]bool{"alice": true, "bob": true, "carol": true}}
		cfg.Identify = creds.identify
		s := startServer(t, cfg)
		_, r := s.export(t, 1, 4096)
		require.NoError(t, s.Allow(1, []string{"alice", "bob", "carol"}))
		ctx := t.Context()
		opts = append(opts, WithConns(2))
		alice1 := dial(t, s.addr, append(opts, WithCredential([]byte("alice")))...)
		alice2 := dial(t, s.addr, append(opts, WithCredential([]byte("alice")))...)
		bob := dial(t, s.addr, append(opts, WithCredential([]byte("bob")))...)
		buf := make([]byte, 8)
		for _, c := range []*Client{alice1, alice2, bob} {
			require.NoError(t, c.Read(ctx, r, 0, buf))
		}

		creds.withdraw("alice")
		require.Equal(t, 4, s.Disconnect("alice", nil), "two clients of alice, two connections each")
		for _, c := range []*Client{alice1, alice2} {
			within(t, "a read on a disconnected connection", func() {
				err := c.Read(ctx, r, 0, buf)
				require.True(t, isClosedish(err), "a read on a connection of a disconnected principal: %v", err)
			})
		}
		require.NoError(t, bob.Read(ctx, r, 0, buf))
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := Dial(dctx, s.addr, append(opts, WithCredential([]byte("alice")))...)
		require.ErrorIs(t, err, rdma.ErrAccessDenied)

		// carol's hello: Identify finds her credential live, then it is
		// withdrawn and Disconnect runs before the hello finishes.
		inside, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		creds.mu.Lock()
		creds.hold = func() {
			once.Do(func() {
				close(inside)
				<-release
			})
		}
		creds.mu.Unlock()
		dialed := make(chan error, 1)
		go func() {
			// One connection: a second one's hello would find the
			// credential withdrawn anyway.
			c, err := Dial(dctx, s.addr, append(opts, WithConns(1), WithCredential([]byte("carol")))...)
			if c != nil {
				c.Close()
			}
			dialed <- err
		}()
		<-inside
		creds.withdraw("carol")
		require.Zero(t, s.Disconnect("carol", nil), "carol's connection has no principal yet")
		close(release)
		require.ErrorIs(t, <-dialed, rdma.ErrAccessDenied)
		require.NoError(t, bob.Read(ctx, r, 0, buf))

		// dave's hello while other principals are cut during each of its
		// checks, more than the server keeps: his is not checked again
		// (another tenant's cuts cannot get it refused).
		creds.mu.Lock()
		creds.live["dave"] = true
		checks := make(chan chan struct{})
		creds.hold = func() {
			release := make(chan struct{})
			checks <- release
			<-release
		}
		creds.mu.Unlock()
		go func() {
			c, err := Dial(dctx, s.addr, append(opts, WithConns(1), WithCredential([]byte("dave")))...)
			if c != nil {
				c.Close()
			}
			dialed <- err
		}()
		n := 0
	hello:
		for {
			select {
			case release := <-checks:
				n++
				for i := range 2 * maxCutsKept {
					s.Disconnect(fmt.Sprintf("reaped-%d", i), nil)
				}
				close(release)
			case err := <-dialed:
				require.NoError(t, err, "after cuts of others in each of %d checks", n)
				break hello
			}
		}
		require.Equal(t, 1, n, "checked once")
		creds.mu.Lock()
		creds.hold = nil
		creds.mu.Unlock()
	})
}

// TestDisconnectKeepsTenant: Disconnect with a tenant to keep closes the
// principal's connections whose credential Identify named another tenant
// for (an earlier holder of the principal) and leaves those of the holder
// now.
func TestDisconnectKeepsTenant(t *testing.T) {
	// The credential "peer/app#T" acts for peer/app as tenant T.
	s := startServer(t, ServerConfig{Identify: func(cred []byte, _ *x509.Certificate) (string, string, error) {
		p, tenant, _ := strings.Cut(string(cred), "#")
		return p, tenant, nil
	}})
	_, r := s.export(t, 1, 4096)
	require.NoError(t, s.Allow(1, []string{"peer/app"}))
	ctx := t.Context()
	buf := make([]byte, 8)
	before := dial(t, s.addr, WithConns(1), WithCredential([]byte("peer/app#uid:1000")))
	now := dial(t, s.addr, WithConns(1), WithCredential([]byte("peer/app#uid:2000")))
	require.NoError(t, before.Read(ctx, r, 0, buf))
	require.Equal(t, 1, s.Disconnect("peer/app", func(t string) bool { return t == "uid:2000" }))
	within(t, "a read on the earlier holder's connection", func() {
		err := before.Read(ctx, r, 0, buf)
		require.True(t, isClosedish(err), "the earlier holder's connection: %v", err)
	})
	require.NoError(t, now.Read(ctx, r, 0, buf))
}

// TestCutLogKeepsWhatHellosNeed: the cuts a hello under way needs are kept
// however many others come after it, and those no hello needs are
// forgotten once many are kept.
func TestCutLogKeepsWhatHellosNeed(t *testing.T) {
	var l cutLog
	c, d := &srvConn{}, &srvConn{}
	l.begin(c)
	for i := range 3 * maxCutsKept {
		l.add(fmt.Sprintf("other-%d", i))
	}
	l.add("p")
	for i := range 3 * maxCutsKept {
		l.add(fmt.Sprintf("more-%d", i))
	}
	l.begin(d)
	require.False(t, l.end(d, "p"), "cut before d began")
	require.True(t, l.end(c, "p"), "cut while c's Identify ran, %d cuts of others around it", 6*maxCutsKept)
	for i := range maxCutsKept + 1 {
		l.add(fmt.Sprintf("late-%d", i))
	}
	require.LessOrEqual(t, len(l.at), maxCutsKept+1, "no hello under way: the old cuts are forgotten")
}
