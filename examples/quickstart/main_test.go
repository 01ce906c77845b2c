package main

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestQuickstartStartsEmbeddedPool runs the example as a new user would on
// a machine with no poold: it must start its own, use every tier, and label
// the emulated one.
func TestQuickstartStartsEmbeddedPool(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, filepath.Join(t.TempDir(), "none.sock"), 4<<20))
	s := out.String()
	require.Contains(t, s, "started one")
	require.Regexp(t, `cxl\s+emulated\s+EMULATED\s+4.0 MiB\s+yes`, s)
	require.Regexp(t, `local\s+dram\s+real\s+4.0 MiB\s+yes`, s)
	require.Contains(t, s, "ordinary DRAM, not CXL")
	require.NotContains(t, s, "MISMATCH")
}
