package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/cluster/memnet"
)

func newKey(t *testing.T) []byte {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

func TestParseKeys(t *testing.T) {
	k16, k24, k32 := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 24), bytes.Repeat([]byte{3}, 32)
	b64 := base64.StdEncoding.EncodeToString
	keys, err := ParseKeys([]byte("# comment\n\n  " + b64(k32) + "  \n" + b64(k16) + "\n" + b64(k24) + "\n" + b64(k32) + "\n"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{k32, k16, k24}, keys, "in order, the primary first, each once")
	back, err := ParseKeys(FormatKeys(keys))
	require.NoError(t, err)
	require.Equal(t, keys, back)

	for _, tc := range []struct{ name, file, want string }{
		{"empty", "", "no key in the file"},
		{"comments only", "# nothing\n", "no key in the file"},
		{"wrong size", b64(make([]byte, 20)) + "\n", "gossip key of 20 bytes; use 16, 24 or 32 bytes"},
		{"not base64", "not-a-key!\n", "line 1: cluster: bad gossip key: gossip key is not base64"},
		{"second line bad", b64(k16) + "\n" + b64([]byte("short")) + "\n", "line 2:"},
		{"too many", strings.Repeat("x", 0) + manyKeys(MaxKeys+1), "more than 16 keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseKeys([]byte(tc.file))
			require.ErrorIs(t, err, ErrBadKey)
			require.ErrorContains(t, err, tc.want)
		})
	}
	cfg := DefaultConfig()
	cfg.Keys = [][]byte{k16, []byte("seven b")}
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig)
	require.ErrorContains(t, cfg.Validate(), "Keys[1]: cluster: bad gossip key: gossip key of 7 bytes; use 16, 24 or 32 bytes")
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		k := make([]byte, 16)
		k[0] = byte(i)
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	return b.String()
}

// FuzzParseKeys feeds arbitrary key files to the parser: it never panics,
// and what it accepts is 1 to MaxKeys distinct keys of an allowed size
// that FormatKeys writes back to the same keys.
func FuzzParseKeys(f *testing.F) {
	f.Add([]byte(manyKeys(2)))
	f.Add([]byte("# c\n" + base64.StdEncoding.EncodeToString(make([]byte, 24)) + "\n"))
	f.Add([]byte("AAAA\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := ParseKeys(b)
		if err != nil {
			require.ErrorIs(t, err, ErrBadKey)
			return
		}
		require.NotEmpty(t, keys)
		require.LessOrEqual(t, len(keys), MaxKeys)
		for _, k := range keys {
			require.NoError(t, CheckKey(k))
		}
		back, err := ParseKeys(FormatKeys(keys))
		require.NoError(t, err)
		require.Equal(t, keys, back)
	})
}

// startKeyed starts a node whose gossip is sealed with keys.
func startKeyed(t *testing.T, n *memnet.Network, name string, keys ...[]byte) *Cluster {
	t.Helper()
	tr, err := n.NewTransport(name)
	require.NoError(t, err)
	cfg := fastConfig(name)
	cfg.Transport = tr
	cfg.Keys = keys
	c, err := New(cfg, testMeta(name))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Shutdown()) })
	return c
}

// TestGossipKeys: nodes with the key form a cluster; a node without it,
// or with another key, is never listed by them; a rotation (install, use,
// remove) keeps the cluster together, and a node that was away during it
// gets back in once the new key is installed on it.
func TestGossipKeys(t *testing.T) {
	net := memnet.New(0)
	old, fresh := newKey(t), newKey(t)
	a := startKeyed(t, net, "a", old)
	b := startKeyed(t, net, "b", old)
	_, err := b.Join(t.Context(), []string{a.Self().Addr})
	require.NoError(t, err)
	waitFor(t, "a and b see each other", func() bool { return stateOn(a, "b") == "alive" && stateOn(b, "a") == "alive" })

	// Join retries until its context ends: one attempt is enough.
	refused := func(n *Cluster) error {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := n.Join(ctx, []string{a.Self().Addr})
		return err
	}
	plain := startMem(t, net, "plain")
	require.ErrorIs(t, refused(plain), ErrNoSeed, "a drops the unsealed push/pull")
	other := startKeyed(t, net, "other", newKey(t))
	require.ErrorIs(t, refused(other), ErrNoSeed)

	// The rotation, with c away (it has only the old key).
	c := startKeyed(t, net, "c", old)
	for _, n := range []*Cluster{a, b} {
		require.NoError(t, n.InstallKey(fresh))
	}
	for _, n := range []*Cluster{a, b} {
		require.NoError(t, n.UseKey(fresh))
	}
	for _, n := range []*Cluster{a, b} {
		require.ErrorIs(t, n.RemoveKey(fresh), ErrBadKey, "the primary cannot be removed")
		require.NoError(t, n.RemoveKey(old))
		require.Equal(t, [][]byte{fresh}, n.Keys())
	}
	require.NoError(t, b.SetMeta(func(m *Meta) { m.Draining = true }))
	waitFor(t, "a hears b under the new key", func() bool { m, ok := a.Member("b"); return ok && m.Meta.Draining })
	require.ErrorIs(t, refused(c), ErrNoSeed, "c, with the old key only, is not admitted")

	require.ErrorIs(t, c.UseKey(fresh), ErrBadKey, "use before install")
	require.NoError(t, c.InstallKey(fresh))
	require.NoError(t, c.UseKey(fresh))
	_, err = c.Join(t.Context(), []string{a.Self().Addr})
	require.NoError(t, err)
	waitFor(t, "c is back", func() bool { return stateOn(a, "c") == "alive" && stateOn(b, "c") == "alive" })

	// No keyless or foreign node was ever listed.
	for _, n := range []*Cluster{a, b, c} {
		require.Equal(t, "absent", stateOn(n, "plain"))
		require.Equal(t, "absent", stateOn(n, "other"))
	}
	require.ErrorIs(t, plain.InstallKey(fresh), ErrBadKey, "a node without encryption has no keyring")
	require.ErrorIs(t, a.InstallKey([]byte("short")), ErrBadKey)
}
