package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
)

// Files names the three files of one side of a mutual TLS connection. A
// plain value.
type Files struct {
	Cert string // this side's certificate (PEM)
	Key  string // its private key (PEM)
	CA   string // the CA certificate(s) the other side must chain to (PEM)
}

// InDir is the Files of a node or client that Init made in dir.
func InDir(dir, name string) Files {
	return Files{Cert: CertFile(dir, name), Key: KeyFile(dir, name), CA: CAFile(dir)}
}

// IsZero reports whether no file is named.
func (f Files) IsZero() bool { return f == Files{} }

// Check reports an error naming what is missing when some but not all
// three files are named. flag prefixes the names in the message, e.g.
// "--tls-" gives "--tls-cert".
func (f Files) Check(flag string) error {
	if f.IsZero() || f.Cert != "" && f.Key != "" && f.CA != "" {
		return nil
	}
	var miss []string
	for _, m := range []struct{ v, n string }{{f.Cert, "cert"}, {f.Key, "key"}, {f.CA, "ca"}} {
		if m.v == "" {
			miss = append(miss, flag+m.n)
		}
	}
	return fmt.Errorf("%w: %v not set: mutual TLS needs a certificate, its key and the CA (make them with 'memctl certs init')", ErrLoad, miss)
}

func (f Files) load() (tls.Certificate, *x509.CertPool, error) {
	if err := f.Check("--tls-"); err != nil {
		return tls.Certificate{}, nil, err
	}
	if f.IsZero() {
		return tls.Certificate{}, nil, fmt.Errorf("%w: no certificate, key or CA named (make them with 'memctl certs init')", ErrLoad)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("%w: %s with %s: %w", ErrLoad, f.Cert, f.Key, err)
	}
	b, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("%w: %w", ErrLoad, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return tls.Certificate{}, nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrLoad, f.CA)
	}
	return pair, pool, nil
}

// Server is the TLS configuration of a server that requires every client
// to present a certificate chaining to the CA (TLS 1.3 only).
func (f Files) Server() (*tls.Config, error) {
	pair, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// Client is the TLS configuration of a client that presents its
// certificate and verifies the server's against the CA. The caller sets
// ServerName to the host it dials (a name or IP in the server's
// certificate) when the dialer does not.
func (f Files) Client() (*tls.Config, error) {
	pair, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// Verifier is the TLS configuration of a client that presents no
// certificate and accepts only a server whose certificate chains to the
// CA in caPEM and names serverName (TLS 1.3 only): how a data-plane client
// verifies a segment's home, given the CA and the home's node name.
func Verifier(caPEM []byte, serverName string) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%w: the CA given (%d bytes) holds no PEM certificate", ErrLoad, len(caPEM))
	}
	if serverName == "" {
		return nil, fmt.Errorf("%w: no server name to verify the server's certificate against", ErrLoad)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS13}, nil
}

// Identity is the common name of the verified peer certificate of a TLS
// connection, "" when the peer presented none.
func Identity(cs tls.ConnectionState) string {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return ""
	}
	return cs.VerifiedChains[0][0].Subject.CommonName
}

// ServesTLS reports whether the verified peer certificate of cs may serve
// TLS (extended key usage server authentication, any, or none listed), as
// a node's certificate must, since its daemon's listeners serve with it;
// the client certificates Init writes may not.
func ServesTLS(cs tls.ConnectionState) bool {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return false
	}
	eku := cs.VerifiedChains[0][0].ExtKeyUsage
	return len(eku) == 0 || slices.Contains(eku, x509.ExtKeyUsageServerAuth) || slices.Contains(eku, x509.ExtKeyUsageAny)
}

// CheckName reports an error matching ErrWrongName unless the peer
// certificate of cs names node: a node's name is its certificate's
// subject common name (Init writes the node name there, and as a DNS
// name). Use it in tls.Config.VerifyConnection, which runs after the chain
// is verified, when dialing a peer known by its name.
func CheckName(cs tls.ConnectionState, node string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: expected node %q, and the peer presented no certificate", ErrWrongName, node)
	}
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != node {
		return fmt.Errorf("%w: expected node %q, and the certificate's common name is %q; give each node the certificate made for its name ('memctl certs init --nodes %s')", ErrWrongName, node, cn, node)
	}
	return nil
}
