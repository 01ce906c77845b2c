package paths

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
)

func TestParseTarget(t *testing.T) {
	wd, err := os.Getwd()
	require.NoError(t, err)
	t.Setenv(SocketEnv, "rel/default.sock")
	for _, tc := range []struct {
		target, network, addr, bad string
	}{
		{target: "", network: "unix", addr: filepath.Join(wd, "rel/default.sock")},
		{target: "a.sock", network: "unix", addr: filepath.Join(wd, "a.sock")},
		{target: "./a.sock", network: "unix", addr: filepath.Join(wd, "a.sock")},
		{target: "sub/../b.sock", network: "unix", addr: filepath.Join(wd, "b.sock")},
		{target: "/run/farmem/poold.sock", network: "unix", addr: "/run/farmem/poold.sock"},
		{target: "unix://a.sock", network: "unix", addr: filepath.Join(wd, "a.sock")},
		{target: "unix:/tmp/p.sock", network: "unix", addr: "/tmp/p.sock"},
		{target: "tcp://10.0.0.5:7950", network: "tcp", addr: "10.0.0.5:7950"},
		{target: "tcp://[::1]:7950", network: "tcp", addr: "[::1]:7950"},
		{target: "localhost:7950", bad: "write tcp://localhost:7950"},
		{target: "tcp://10.0.0.5", bad: "write tcp://HOST:PORT"},
		{target: "http://x/y", bad: "unix://PATH or tcp://HOST:PORT"},
		{target: "unix://", bad: "give the path"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			network, addr, err := ParseTarget(tc.target)
			if tc.bad != "" {
				require.ErrorIs(t, err, errs.ErrInvalid)
				require.ErrorContains(t, err, tc.bad)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.network, network)
			require.Equal(t, tc.addr, addr)
		})
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"", "a.sock", "unix://x", "tcp://h:1", "h:1", "x://y", "unix:", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		network, addr, err := ParseTarget(s)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("%q: error %v does not match ErrInvalid", s, err)
			}
			return
		}
		switch network {
		case "unix":
			if !filepath.IsAbs(addr) {
				t.Fatalf("%q: unix path %q is not absolute", s, addr)
			}
		case "tcp":
			if strings.Contains(addr, "/") {
				t.Fatalf("%q: tcp address %q has a path", s, addr)
			}
		default:
			t.Fatalf("%q: network %q", s, network)
		}
	})
}
