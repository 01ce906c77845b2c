package cluster

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startNet starts a node on memberlist's real UDP+TCP transport, on
// 127.0.0.1 and a port the kernel picks.
func startNet(t *testing.T, name string) *Cluster {
	t.Helper()
	cfg := fastConfig(name)
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
	c, err := New(cfg, testMeta(name))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Shutdown()) })
	return c
}

func TestRealNetworkOnLoopback(t *testing.T) {
	cs := []*Cluster{startNet(t, "r0"), startNet(t, "r1"), startNet(t, "r2")}
	for _, c := range cs {
		host, port, err := net.SplitHostPort(c.Self().Addr)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host)
		require.NotEqual(t, "0", port, "the bound port is advertised")
	}
	for _, c := range cs[1:] {
		n, err := c.Join(t.Context(), []string{cs[0].Self().Addr})
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	waitFor(t, "all three see each other with meta", func() bool {
		for _, c := range cs {
			ms := c.Members()
			if len(ms) != 3 {
				return false
			}
			for _, m := range ms {
				if m.State != StateAlive || m.MetaErr != nil || m.Meta.GRPCAddr != m.Name+".farm.example:7070" {
					return false
				}
			}
		}
		return true
	})

	require.NoError(t, cs[1].SetMeta(func(m *Meta) { m.Draining = true }))
	waitFor(t, "r0 and r2 see r1 draining", func() bool {
		a, _ := cs[0].Member("r1")
		b, _ := cs[2].Member("r1")
		return a.Meta.Draining && b.Meta.Draining
	})

	require.NoError(t, cs[2].Leave(5*time.Second))
	require.NoError(t, cs[2].Shutdown())
	waitFor(t, "r0 and r1 see r2 left", func() bool {
		return stateOn(cs[0], "r2") == "left" && stateOn(cs[1], "r2") == "left"
	})
	require.NoError(t, cs[1].Shutdown())
	waitFor(t, "r0 sees r1 dead", func() bool { return stateOn(cs[0], "r1") == "dead" })

	s := cs[0].Stats()
	require.Equal(t, Stats{Alive: 1, Dead: 1, Left: 1}, Stats{Alive: s.Alive, Dead: s.Dead, Left: s.Left})
	require.NotZero(t, s.PacketsSent)
	require.NotZero(t, s.PacketBytesReceived)
	require.NotZero(t, s.StreamBytesSent)
	t.Logf("r0 after the test: %+v", s)
}

func TestRealNetworkPortInUse(t *testing.T) {
	c := startNet(t, "busy")
	_, port, err := net.SplitHostPort(c.Self().Addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg := fastConfig("second")
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", p
	_, err = New(cfg, testMeta("second"))
	require.ErrorContains(t, err, fmt.Sprintf("127.0.0.1 port %d", p))
	require.ErrorContains(t, err, "pick a free port")
}
