package testcluster

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// echoEnv makes the test binary a TCP echo server listening on its value;
// tests start it inside a host with Host.StartCmd.
const echoEnv = "FARMEM_TESTCLUSTER_ECHO"

func TestMain(m *testing.M) {
	if addr := os.Getenv(echoEnv); addr != "" {
		os.Exit(runEcho(addr))
	}
	goleak.VerifyTestMain(m)
}

// runEcho serves until killed.
func runEcho(addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		return 1
	}
	fmt.Printf("listening on %s\n", l.Addr())
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

func TestOptionsResolve(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr bool
		hosts   int
		subnet  string
		first   string
		last    string
	}{
		{name: "zero", opts: Options{Prefix: "x"}, hosts: 3},
		{name: "explicit", opts: Options{Hosts: 2, Prefix: "abc_1", Subnet: "10.9.8.0/30"}, hosts: 2, subnet: "10.9.8.0/30", first: "10.9.8.1", last: "10.9.8.2"},
		{name: "crosses a byte", opts: Options{Hosts: 250, Prefix: "a", Subnet: "10.1.0.0/16"}, hosts: 250, subnet: "10.1.0.0/16", first: "10.1.0.1", last: "10.1.0.250"},
		{name: "negative hosts", opts: Options{Hosts: -1, Prefix: "a"}, wantErr: true},
		{name: "too many hosts", opts: Options{Hosts: 251, Prefix: "a"}, wantErr: true},
		{name: "subnet too small", opts: Options{Hosts: 3, Prefix: "a", Subnet: "10.9.8.0/30"}, wantErr: true},
		{name: "dash in prefix", opts: Options{Prefix: "a-b"}, wantErr: true},
		{name: "slash in prefix", opts: Options{Prefix: "../etc"}, wantErr: true},
		{name: "long prefix", opts: Options{Prefix: strings.Repeat("a", 25)}, wantErr: true},
		{name: "not cidr", opts: Options{Prefix: "a", Subnet: "10.0.0.0"}, wantErr: true},
		{name: "host bits", opts: Options{Prefix: "a", Subnet: "10.0.0.1/24"}, wantErr: true},
		{name: "ipv6", opts: Options{Prefix: "a", Subnet: "fd00::/64"}, wantErr: true},
		{name: "/31", opts: Options{Hosts: 1, Prefix: "a", Subnet: "10.0.0.0/31"}, wantErr: true},
		{name: "/7", opts: Options{Prefix: "a", Subnet: "10.0.0.0/7"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.opts.resolve()
			if tt.wantErr {
				require.ErrorIs(t, err, ErrInvalidOptions)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.hosts, c.hosts)
			if tt.subnet != "" {
				require.Equal(t, tt.subnet, c.subnet.String())
				require.Equal(t, tt.first, hostAddr(c.subnet, 0).String())
				require.Equal(t, tt.last, hostAddr(c.subnet, c.hosts-1).String())
			} else {
				require.Equal(t, 24, c.subnet.Bits())
				require.True(t, netip.MustParsePrefix("10.211.0.0/16").Overlaps(c.subnet))
			}
			for i := range c.hosts {
				require.True(t, c.subnet.Contains(hostAddr(c.subnet, i)))
			}
		})
	}
}

func TestDefaultPrefixesDiffer(t *testing.T) {
	a, err := Options{}.resolve()
	require.NoError(t, err)
	b, err := Options{}.resolve()
	require.NoError(t, err)
	require.NotEqual(t, a.prefix, b.prefix)
	for _, c := range []config{a, b} {
		pid, prefix, ok := staleOwner(hostName(c.prefix, 3))
		require.True(t, ok, c.prefix)
		require.Equal(t, os.Getpid(), pid)
		require.Equal(t, c.prefix, prefix)
		// The longest name must still be a valid namespace name and the
		// interface names never carry the prefix.
		require.LessOrEqual(t, len(hostName(c.prefix, maxHosts-1)), 255)
	}
}

func TestOwnsAndStaleOwner(t *testing.T) {
	tests := []struct {
		name, ns string
		owns     bool
		pid      int
	}{
		{name: "switch", ns: "fmt12c0-sw", owns: true, pid: 12},
		{name: "host", ns: "fmt12c0-h7", owns: true, pid: 12},
		{name: "other cluster", ns: "fmt12c1-h0", pid: 12},
		{name: "longer prefix", ns: "fmt12c0x-h0"},
		{name: "suffix after index", ns: "fmt12c0-h0x"},
		{name: "no index", ns: "fmt12c0-h"},
		{name: "someone else's", ns: "blue"},
		{name: "no pid", ns: "fmtc0-h0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.owns, owns("fmt12c0", tt.ns))
			pid, _, ok := staleOwner(tt.ns)
			require.Equal(t, tt.pid != 0, ok)
			require.Equal(t, tt.pid, pid)
		})
	}
}

func TestCheckDial(t *testing.T) {
	tests := []struct {
		name, network, addr string
		families            []string
		want                error
	}{
		{name: "tcp", network: "tcp", addr: "10.0.0.1:80", families: []string{"tcp", "udp"}},
		{name: "udp6", network: "udp6", addr: "[::1]:53", families: []string{"tcp", "udp"}},
		{name: "host name", network: "tcp", addr: "localhost:80", families: []string{"tcp"}, want: ErrAddress},
		{name: "no port", network: "tcp", addr: "10.0.0.1", families: []string{"tcp"}, want: ErrAddress},
		{name: "unix", network: "unix", addr: "/tmp/x", families: []string{"tcp", "udp"}, want: ErrNetwork},
		{name: "udp on tcp-only", network: "udp", addr: "10.0.0.1:80", families: []string{"tcp"}, want: ErrNetwork},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDial(tt.network, tt.addr, tt.families...)
			if tt.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.want)
			}
		})
	}
	// The public methods check before touching any namespace.
	h := &Host{Name: "none"}
	_, err := h.Dial(t.Context(), "tcp", "example.com:80")
	require.ErrorIs(t, err, ErrAddress)
	_, err = h.Listen(t.Context(), "udp", "0.0.0.0:0")
	require.ErrorIs(t, err, ErrNetwork)
	_, err = h.ListenPacket(t.Context(), "tcp", "0.0.0.0:0")
	require.ErrorIs(t, err, ErrNetwork)
}

func TestOutputBuffer(t *testing.T) {
	o := newOutputBuffer()
	s, grew := o.snapshot()
	require.Empty(t, s)
	_, err := o.Write([]byte("hello "))
	require.NoError(t, err)
	select {
	case <-grew:
	default:
		t.Fatal("a write did not wake readers")
	}
	big := strings.Repeat("x", maxOutput)
	_, err = o.Write([]byte(big))
	require.NoError(t, err)
	s, _ = o.snapshot()
	require.Len(t, s, maxOutput/2)
}
