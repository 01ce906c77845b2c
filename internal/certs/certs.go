package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultValidity is how long Init's certificates are valid: one year.
const DefaultValidity = 365 * 24 * time.Hour

// Node is a daemon to make a certificate for. A plain value.
type Node struct {
	// Name is the node's name (poold --node): the certificate's common name
	// and a DNS name in it. 1 to 64 characters of letters, digits, '.', '-', '_'.
	Name string
	// IPs are addresses peers and memctl dial the node at; 127.0.0.1 and
	// ::1 are always added.
	IPs []net.IP
}

// ParseNode reads a node as `memctl certs init --nodes` takes it: a name,
// optionally followed by '=' and IP addresses joined by '+', e.g.
// "a=10.0.0.5" or "b=10.0.0.6+fd00::6".
func ParseNode(s string) (Node, error) {
	name, ips, _ := strings.Cut(s, "=")
	n := Node{Name: name}
	if err := checkName(name); err != nil {
		return Node{}, err
	}
	if ips == "" {
		return n, nil
	}
	for _, a := range strings.Split(ips, "+") {
		ip := net.ParseIP(a)
		if ip == nil {
			return Node{}, fmt.Errorf("%w: node %q: %q is not an IP address (write name=IP+IP)", ErrInvalid, s, a)
		}
		n.IPs = append(n.IPs, ip)
	}
	return n, nil
}

// InitOptions says which certificates Init makes. A plain value.
type InitOptions struct {
	// Nodes get certificates for both server and client use.
	Nodes []Node
	// Clients get client-only certificates whose common name is the
	// identity poold sees (e.g. an application or an operator).
	Clients []string
	// Validity of every certificate made. Default: DefaultValidity.
	Validity time.Duration
}

// CAFile is the CA certificate in dir (what --tls-ca names).
func CAFile(dir string) string { return filepath.Join(dir, "ca.crt") }

// CertFile is the certificate of a node or client in dir (--tls-cert).
func CertFile(dir, name string) string { return filepath.Join(dir, name+".crt") }

// KeyFile is the private key of a node or client in dir (--tls-key).
func KeyFile(dir, name string) string { return filepath.Join(dir, name+".key") }

func caKeyFile(dir string) string { return filepath.Join(dir, "ca.key") }

// GossipKeyFile is the cluster's gossip key in dir (poold
// --gossip-key-file): base64 of 32 random bytes on one line.
func GossipKeyFile(dir string) string { return filepath.Join(dir, "gossip.key") }

// makeGossipKey writes a gossip key in dir unless one is there, and
// returns the files written.
func makeGossipKey(dir string) ([]string, error) {
	path := GossipKeyFile(dir)
	if _, err := os.Stat(path); err == nil {
		return nil, nil
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("certs: gossip key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("certs: write %s: %w", path, err)
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n")
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, fmt.Errorf("certs: write %s: %w", path, err)
	}
	return []string{path}, nil
}

func checkName(name string) error {
	if name == "" || len(name) > 64 || name == "ca" {
		return fmt.Errorf("%w: name %q: use 1 to 64 characters, and not \"ca\"", ErrInvalid, name)
	}
	for _, r := range name {
		ok := r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !ok || name[0] == '.' {
			return fmt.Errorf("%w: name %q: use letters, digits, '.', '-' and '_' (it becomes a file name)", ErrInvalid, name)
		}
	}
	return nil
}

// Init makes, in dir, a CA (ca.crt, ca.key) unless dir holds one already,
// and signs with it a certificate and key (NAME.crt, NAME.key) for every
// node and client. With nodes, it also makes the cluster's gossip key
// (gossip.key, see GossipKeyFile) unless dir holds one. Keys are ECDSA P-256, written with mode 0600. An
// existing certificate of the same name is replaced. It returns the files
// written.
func Init(dir string, o InitOptions) ([]string, error) {
	if len(o.Nodes)+len(o.Clients) == 0 {
		return nil, fmt.Errorf("%w: no nodes and no clients: name at least one (--nodes a,b,c)", ErrInvalid)
	}
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.Validity < 0 {
		return nil, fmt.Errorf("%w: validity %s is negative", ErrInvalid, o.Validity)
	}
	seen := map[string]bool{}
	for _, n := range o.Nodes {
		if err := checkName(n.Name); err != nil {
			return nil, err
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("%w: name %q given twice", ErrInvalid, n.Name)
		}
		seen[n.Name] = true
	}
	for _, c := range o.Clients {
		if err := checkName(c); err != nil {
			return nil, err
		}
		if seen[c] {
			return nil, fmt.Errorf("%w: name %q given twice", ErrInvalid, c)
		}
		seen[c] = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: directory %s: %w", dir, err)
	}
	ca, caKey, written, err := loadOrMakeCA(dir, o.Validity)
	if err != nil {
		return nil, err
	}
	if len(o.Nodes) > 0 {
		files, err := makeGossipKey(dir)
		if err != nil {
			return nil, err
		}
		written = append(written, files...)
	}
	for _, n := range o.Nodes {
		tmpl := leafTemplate(n.Name, o.Validity, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
		tmpl.DNSNames = []string{n.Name, "localhost"}
		tmpl.IPAddresses = append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, n.IPs...)
		files, err := writeLeaf(dir, n.Name, tmpl, ca, caKey)
		if err != nil {
			return nil, err
		}
		written = append(written, files...)
	}
	for _, c := range o.Clients {
		files, err := writeLeaf(dir, c, leafTemplate(c, o.Validity, x509.ExtKeyUsageClientAuth), ca, caKey)
		if err != nil {
			return nil, err
		}
		written = append(written, files...)
	}
	return written, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func leafTemplate(name string, validity time.Duration, usage ...x509.ExtKeyUsage) *x509.Certificate {
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"farmem"}},
		NotBefore:    now.Add(-time.Hour), // tolerate clocks a little behind
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
}

func loadOrMakeCA(dir string, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, []string, error) {
	certPEM, cerr := os.ReadFile(CAFile(dir))
	keyPEM, kerr := os.ReadFile(caKeyFile(dir))
	if cerr == nil && kerr == nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: %s and %s: %w (remove both to make a new CA)", ErrLoad, CAFile(dir), caKeyFile(dir), err)
		}
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, nil, nil, fmt.Errorf("%w: %s is not an ECDSA key", ErrLoad, caKeyFile(dir))
		}
		return pair.Leaf, key, nil, nil
	}
	if !errors.Is(cerr, os.ErrNotExist) || !errors.Is(kerr, os.ErrNotExist) {
		return nil, nil, nil, fmt.Errorf("%w: %s holds only half a CA (ca.crt and ca.key go together): %w", ErrLoad, dir, errors.Join(cerr, kerr))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "farmem CA", Organization: []string{"farmem"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	if err := writePair(CAFile(dir), caKeyFile(dir), der, key); err != nil {
		return nil, nil, nil, err
	}
	return ca, key, []string{CAFile(dir), caKeyFile(dir)}, nil
}

func writeLeaf(dir, name string, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) ([]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: key for %s: %w", name, err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("certs: certificate for %s: %w", name, err)
	}
	if err := writePair(CertFile(dir, name), KeyFile(dir, name), der, key); err != nil {
		return nil, err
	}
	return []string{CertFile(dir, name), KeyFile(dir, name)}, nil
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs: encode key %s: %w", keyPath, err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return fmt.Errorf("certs: write %s: %w", keyPath, err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("certs: write %s: %w", certPath, err)
	}
	return nil
}
