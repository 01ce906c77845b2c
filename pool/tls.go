package pool

import (
	"crypto/tls"
	"fmt"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/farmem/farmem/internal/certs"
)

// defaultAllowUIDs is root and the daemon's own uid.
func defaultAllowUIDs() IDList {
	ids := IDList{0}
	if uid := uint32(os.Getuid()); uid != 0 {
		ids = append(ids, uid)
	}
	return ids
}

// tlsFiles is the node's mutual-TLS material.
func (c *Config) tlsFiles() certs.Files {
	return certs.Files{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA}
}

// validateSecurity checks the TLS, allow-list, quota and limit settings.
func (c *Config) validateSecurity() error {
	f := c.tlsFiles()
	if err := f.Check("tls-"); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	switch {
	case c.Listen != "" && !c.Insecure && f.IsZero():
		return fmt.Errorf("%w: listen %s needs mutual TLS: set tls-cert, tls-key and tls-ca (make them with 'memctl certs init --dir DIR --nodes %s'), or set insecure for plaintext on a trusted network", ErrConfig, c.Listen, c.Node)
	case c.Insecure && !f.IsZero():
		return fmt.Errorf("%w: insecure and tls-cert/tls-key/tls-ca are both set; choose one", ErrConfig)
	case len(c.AllowUIDs) == 0 && len(c.AllowGIDs) == 0:
		return fmt.Errorf("%w: allow-uids and allow-gids are both empty: no local client could connect; list at least one uid (e.g. %d)", ErrConfig, os.Getuid())
	case c.MaxSegmentsPerClient < 0:
		return fmt.Errorf("%w: max-segments-per-client %d is negative; use 0 for no limit", ErrConfig, c.MaxSegmentsPerClient)
	case c.MaxNameLen < 1 || c.MaxNameLen > MaxNameLen:
		return fmt.Errorf("%w: max-name-len %d: use 1 to %d", ErrConfig, c.MaxNameLen, MaxNameLen)
	case c.DataMaxInflight < 1 || c.DataMaxInflight > 4096:
		return fmt.Errorf("%w: data-max-inflight %d: use 1 to 4096 (default 64)", ErrConfig, c.DataMaxInflight)
	case c.DataBusyPoll < 0 || c.DataBusyPoll > time.Millisecond:
		return fmt.Errorf("%w: data-busy-poll %v: use 0 (off) to 1ms (default 50µs)", ErrConfig, c.DataBusyPoll)
	case c.DataMaxConns < 1:
		return fmt.Errorf("%w: data-max-conns %d: use a positive count (default 4096)", ErrConfig, c.DataMaxConns)
	case c.DataMaxHandshakes < 1 || c.DataMaxHandshakes > c.DataMaxConns:
		return fmt.Errorf("%w: data-max-handshakes %d: use 1 to data-max-conns (%d; default 1024)", ErrConfig, c.DataMaxHandshakes, c.DataMaxConns)
	case c.DataMaxHandshakesPerSource < 1 || c.DataMaxHandshakesPerSource > c.DataMaxHandshakes:
		return fmt.Errorf("%w: data-max-handshakes-per-source %d: use 1 to data-max-handshakes (%d; default 64)", ErrConfig, c.DataMaxHandshakesPerSource, c.DataMaxHandshakes)
	case c.DataMaxConnsPerTenant < 0 || c.DataMaxConnsPerTenant > c.DataMaxConns:
		return fmt.Errorf("%w: data-max-conns-per-tenant %d: use 1 to data-max-conns (%d), or 0 for a quarter of it", ErrConfig, c.DataMaxConnsPerTenant, c.DataMaxConns)
	case c.DataFrameTimeout < 100*time.Millisecond || c.DataFrameTimeout > 10*time.Minute:
		return fmt.Errorf("%w: data-frame-timeout %v: use 100ms to 10m (default 10s)", ErrConfig, c.DataFrameTimeout)
	}
	for _, a := range c.Admins {
		if err := validIdentity(a); err != nil {
			return fmt.Errorf("%w: admins: %w", ErrConfig, err)
		}
	}
	return c.Quotas.validate()
}

// serverCreds are the TCP control plane's transport credentials: mutual
// TLS, or plaintext with Insecure; either settles the listener's handshake
// count (listenControl).
func (c *Config) serverCreds() (grpc.ServerOption, error) {
	if c.Insecure {
		return grpc.Creds(settlingCreds{insecure.NewCredentials()}), nil
	}
	tc, err := c.tlsFiles().Server()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return grpc.Creds(settlingCreds{credentials.NewTLS(tc)}), nil
}

// peerTLS is what this daemon presents when it calls a peer: its node
// certificate, checking the peer's against the CA; nil with Insecure.
func (c *Config) peerTLS() (*tls.Config, error) {
	if c.Insecure || c.tlsFiles().IsZero() {
		return nil, nil
	}
	tc, err := c.tlsFiles().Client()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return tc, nil
}

// dataSecurity is how the data plane protects what it carries: the
// server's TLS configuration (the node certificate, TLS 1.3; no client
// certificate is asked, since application clients have none: the
// credential in the hello authenticates them), a client configuration
// that verifies this node under its name (for its own loopback dials),
// and the CA certificate (PEM) clients verify homes with; the CA is set
// whenever the control plane has TLS, also with DataInsecure, so that this
// node's clients can verify peers that serve TLS. Nil configurations:
// plaintext, which note explains for memctl status.
type dataSecurity struct {
	server, client *tls.Config
	ca             []byte
	note           string // "tls", or "plaintext (why)"
}

func (c *Config) dataSecurity() (dataSecurity, error) {
	f := c.tlsFiles()
	if c.Listen == "" || c.Insecure || f.IsZero() {
		return dataSecurity{note: "plaintext (the control plane has no TLS: no --listen, or --insecure)"}, nil
	}
	ca, err := os.ReadFile(c.TLSCA)
	if err != nil {
		return dataSecurity{}, fmt.Errorf("%w: data plane TLS: %w", ErrConfig, err)
	}
	if c.DataInsecure {
		return dataSecurity{ca: ca, note: "plaintext (--data-insecure)"}, nil
	}
	srv, err := f.Server()
	if err != nil {
		return dataSecurity{}, fmt.Errorf("%w: data plane TLS: %w", ErrConfig, err)
	}
	srv.ClientAuth = tls.VerifyClientCertIfGiven
	cli, err := certs.Verifier(ca, c.Node)
	if err != nil {
		return dataSecurity{}, fmt.Errorf("%w: data plane TLS: %w", ErrConfig, err)
	}
	return dataSecurity{server: srv, client: cli, ca: ca, note: "tls"}, nil
}

// tcpServerOptions are the TCP control plane's gRPC options: its
// credentials, then extra.
func (c *Config) tcpServerOptions(extra ...grpc.ServerOption) ([]grpc.ServerOption, error) {
	creds, err := c.serverCreds()
	if err != nil {
		return nil, err
	}
	return append(slices.Clip(extra), creds), nil
}
