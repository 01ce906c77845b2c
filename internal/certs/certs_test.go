package certs

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseNode(t *testing.T) {
	for _, tc := range []struct {
		in      string
		name    string
		ips     int
		wantErr bool
	}{
		{in: "a", name: "a"},
		{in: "a=10.0.0.5", name: "a", ips: 1},
		{in: "b=10.0.0.6+fd00::6", name: "b", ips: 2},
		{in: "b=host", wantErr: true},
		{in: "", wantErr: true},
		{in: "../x", wantErr: true},
		{in: "ca", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			n, err := ParseNode(tc.in)
			if tc.wantErr {
				require.ErrorIs(t, err, ErrInvalid)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.name, n.Name)
			require.Len(t, n.IPs, tc.ips)
		})
	}
}

// handshake runs a TLS handshake over loopback TCP between a server with
// server and a client with client; it returns the identity the server saw.
// In TLS 1.3 a server refuses a client's certificate after the client's
// side of the handshake is done, so the server's outcome decides.
func handshake(t *testing.T, server, client *tls.Config) (seenByServer string, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		srv := tls.Server(c, server)
		err = srv.Handshake()
		done <- result{id: Identity(srv.ConnectionState()), err: err}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	cerr := tls.Client(c, client).Handshake()
	if cerr != nil {
		c.Close()
	}
	r := <-done
	if cerr != nil {
		return "", cerr
	}
	return r.id, r.err
}

func TestInitAndHandshake(t *testing.T) {
	dir := t.TempDir()
	files, err := Init(dir, InitOptions{Nodes: []Node{{Name: "a"}, {Name: "b", IPs: []net.IP{net.ParseIP("10.0.0.6")}}}, Clients: []string{"app"}})
	require.NoError(t, err)
	require.Len(t, files, 9) // ca + gossip.key + 3 pairs
	require.Contains(t, files, GossipKeyFile(dir))
	gk, err := os.ReadFile(GossipKeyFile(dir))
	require.NoError(t, err)
	fi, err := os.Stat(GossipKeyFile(dir))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	fi, err = os.Stat(KeyFile(dir, "app"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	srv, err := InDir(dir, "b").Server()
	require.NoError(t, err)
	for _, tc := range []struct{ who, serverName, want string }{
		{"app", "10.0.0.6", "app"},
		{"a", "b", "a"},
		{"a", "127.0.0.1", "a"},
	} {
		t.Run(tc.who+"@"+tc.serverName, func(t *testing.T) {
			cl, err := InDir(dir, tc.who).Client()
			require.NoError(t, err)
			cl.ServerName = tc.serverName
			id, err := handshake(t, srv, cl)
			require.NoError(t, err)
			require.Equal(t, tc.want, id)
		})
	}

	// A second Init keeps the CA (old and new certificates chain to it)
	// and the gossip key.
	_, err = Init(dir, InitOptions{Clients: []string{"late"}, Nodes: []Node{{Name: "c"}}})
	require.NoError(t, err)
	gk2, err := os.ReadFile(GossipKeyFile(dir))
	require.NoError(t, err)
	require.Equal(t, gk, gk2)
	cl, err := InDir(dir, "late").Client()
	require.NoError(t, err)
	cl.ServerName = "b"
	id, err := handshake(t, srv, cl)
	require.NoError(t, err)
	require.Equal(t, "late", id)
}

func TestRefused(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	_, err := Init(dir, InitOptions{Nodes: []Node{{Name: "a"}}, Clients: []string{"app"}})
	require.NoError(t, err)
	_, err = Init(other, InitOptions{Clients: []string{"mallory"}})
	require.NoError(t, err)
	srv, err := InDir(dir, "a").Server()
	require.NoError(t, err)

	t.Run("client of another CA", func(t *testing.T) {
		cl, err := InDir(other, "mallory").Client()
		require.NoError(t, err)
		cl.RootCAs = srv.ClientCAs // trusts the server, but the server does not trust it
		cl.ServerName = "a"
		_, err = handshake(t, srv, cl)
		require.Error(t, err)
	})
	t.Run("no client certificate", func(t *testing.T) {
		cl, err := InDir(dir, "app").Client()
		require.NoError(t, err)
		cl.Certificates = nil
		cl.ServerName = "a"
		_, err = handshake(t, srv, cl)
		require.Error(t, err)
	})
	t.Run("name not in the server certificate", func(t *testing.T) {
		cl, err := InDir(dir, "app").Client()
		require.NoError(t, err)
		cl.ServerName = "10.9.9.9"
		_, err = handshake(t, srv, cl)
		require.Error(t, err)
	})
	t.Run("server certificate of another node", func(t *testing.T) {
		cl, err := InDir(dir, "app").Client()
		require.NoError(t, err)
		cl.ServerName = "127.0.0.1" // the address checks out: a's certificate lists it
		cl.VerifyConnection = func(cs tls.ConnectionState) error { return CheckName(cs, "evil2") }
		_, err = handshake(t, srv, cl)
		require.ErrorIs(t, err, ErrWrongName)
		require.ErrorContains(t, err, `expected node "evil2", and the certificate's common name is "a"`)
		cl.VerifyConnection = func(cs tls.ConnectionState) error { return CheckName(cs, "a") }
		_, err = handshake(t, srv, cl)
		require.NoError(t, err)
	})
	t.Run("client certificate cannot serve", func(t *testing.T) {
		bad, err := InDir(dir, "app").Server()
		require.NoError(t, err)
		cl, err := InDir(dir, "a").Client()
		require.NoError(t, err)
		cl.ServerName = "app"
		_, err = handshake(t, bad, cl)
		require.Error(t, err)
	})
}

func TestInitErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		o    InitOptions
	}{
		{"nothing", InitOptions{}},
		{"twice", InitOptions{Nodes: []Node{{Name: "a"}}, Clients: []string{"a"}}},
		{"path", InitOptions{Clients: []string{"a/b"}}},
		{"negative validity", InitOptions{Clients: []string{"a"}, Validity: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Init(dir, tc.o)
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
	half := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(half, "ca.crt"), []byte("x"), 0o644))
	_, err := Init(half, InitOptions{Clients: []string{"a"}})
	require.ErrorIs(t, err, ErrLoad)
}

func TestFilesCheck(t *testing.T) {
	require.NoError(t, Files{}.Check("--tls-"))
	require.NoError(t, Files{Cert: "c", Key: "k", CA: "a"}.Check("--tls-"))
	err := Files{Cert: "c"}.Check("--tls-")
	require.ErrorIs(t, err, ErrLoad)
	require.ErrorContains(t, err, "--tls-key")
	require.ErrorContains(t, err, "--tls-ca")
	_, err = Files{Cert: "/nonexistent/c", Key: "/nonexistent/k", CA: "/nonexistent/a"}.Server()
	require.ErrorIs(t, err, ErrLoad)
}

// TestVerifier: a client without a certificate accepts a server whose
// certificate chains to the CA and names the node it expects, and refuses
// another node's certificate and another CA; unusable input is ErrLoad.
func TestVerifier(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	_, err := Init(dir, InitOptions{Nodes: []Node{{Name: "a"}, {Name: "b"}}})
	require.NoError(t, err)
	_, err = Init(other, InitOptions{Nodes: []Node{{Name: "a"}}})
	require.NoError(t, err)
	ca, err := os.ReadFile(CAFile(dir))
	require.NoError(t, err)
	otherCA, err := os.ReadFile(CAFile(other))
	require.NoError(t, err)
	srv, err := InDir(dir, "a").Server()
	require.NoError(t, err)
	srv.ClientAuth = tls.NoClientCert

	for _, tc := range []struct {
		name   string
		ca     []byte
		server string
		ok     bool
	}{{"its node", ca, "a", true}, {"another node", ca, "b", false}, {"another CA", otherCA, "a", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := Verifier(tc.ca, tc.server)
			require.NoError(t, err)
			_, err = handshake(t, srv, cl)
			require.Equal(t, tc.ok, err == nil, "handshake: %v", err)
		})
	}
	_, err = Verifier([]byte("not PEM"), "a")
	require.ErrorIs(t, err, ErrLoad)
	_, err = Verifier(ca, "")
	require.ErrorIs(t, err, ErrLoad)
}
