package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"
)

// Problem is what a client and a poold's TCP control plane disagree on.
type Problem int

// The problems Diagnose tells apart.
const (
	// ServerWantsTLS: the client spoke plaintext to a TLS server.
	ServerWantsTLS Problem = iota + 1
	// ServerNotTLS: the client spoke TLS to a plaintext (--insecure) server.
	ServerNotTLS
	// ServerUnverified: the server's certificate does not verify against
	// the client's CA, or is not valid for the address dialled.
	ServerUnverified
	// ClientRefused: the server refused the client's certificate.
	ClientRefused
)

// Mismatch is the TLS reason a connection to Addr failed. Callers add the
// advice that fits them (memctl's flags, alloc's options) by Problem.
type Mismatch struct {
	Addr    string
	Problem Problem
	Err     error // the handshake's error; nil for ServerWantsTLS
}

func (m *Mismatch) Error() string {
	switch m.Problem {
	case ServerWantsTLS:
		return fmt.Sprintf("poold at %s serves mutual TLS and this client spoke plaintext without a certificate", m.Addr)
	case ServerNotTLS:
		return fmt.Sprintf("poold at %s does not speak TLS (it runs with --insecure) and this client spoke TLS", m.Addr)
	case ServerUnverified:
		return fmt.Sprintf("poold at %s presented a certificate this client's CA does not vouch for: %v", m.Addr, m.Err)
	default:
		return fmt.Sprintf("poold at %s refused this client's certificate (%v)", m.Addr, m.Err)
	}
}

func (m *Mismatch) Unwrap() error { return m.Err }

// Diagnose looks for a TLS reason why a call to the poold control plane at
// addr (HOST:PORT) failed as unavailable: it connects once more, runs a
// TLS handshake (with client, or, when client is nil because the caller
// spoke plaintext, a probe that only asks whether the server speaks TLS)
// and waits briefly for the server's verdict on the client's certificate.
// It returns a *Mismatch, or nil when nothing listens at addr or TLS is
// not what failed. It waits at most until ctx ends and never more than 2 s.
func Diagnose(ctx context.Context, addr string, client *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil
	}
	defer raw.Close()
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} // a probe: is it TLS at all?
	if client != nil {
		cfg = client.Clone()
	}
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	conn := tls.Client(raw, cfg)
	err = conn.HandshakeContext(ctx)
	shook := err == nil
	if shook {
		// TLS 1.3 servers judge the client's certificate after the
		// client's side of the handshake is done: a refusal arrives as an
		// alert on the first read. A server that accepted waits for the
		// HTTP/2 preface, so the read times out.
		deadline, _ := ctx.Deadline()
		_ = conn.SetReadDeadline(deadline)
		_, err = conn.Read(make([]byte, 1))
	}
	var (
		header tls.RecordHeaderError
		verify *tls.CertificateVerificationError
		op     *net.OpError
	)
	switch {
	case client == nil && (shook || errors.As(err, &op) && op.Op == "remote error"):
		return &Mismatch{Addr: addr, Problem: ServerWantsTLS}
	case client == nil:
		return nil
	case errors.As(err, &header):
		return &Mismatch{Addr: addr, Problem: ServerNotTLS, Err: err}
	case errors.As(err, &verify):
		return &Mismatch{Addr: addr, Problem: ServerUnverified, Err: verifyCause(verify)}
	case errors.As(err, &op) && op.Op == "remote error":
		return &Mismatch{Addr: addr, Problem: ClientRefused, Err: op.Err}
	}
	return nil
}

// verifyCause is the x509 error inside a verification failure, which
// names the certificate's issuer or the names it is valid for.
func verifyCause(v *tls.CertificateVerificationError) error {
	var (
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
	)
	switch {
	case errors.As(v.Err, &unknown):
		return unknown
	case errors.As(v.Err, &host):
		return host
	}
	return v.Err
}
