package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBeyondDRAM runs beyond-dram.sh small: a 198 MiB dataset for an
// application host limited to 128 MiB by a memory cgroup, the rdma tier on a
// second real poold outside the cgroup. spillcache must serve every key;
// otter, holding the dataset on the heap, must not fit.
func TestBeyondDRAM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a memory cgroup; CI runs as root")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("beyond-dram.sh needs python3 for free ports and its JSON summary")
	}
	cmd := exec.CommandContext(t.Context(), "bash", "beyond-dram.sh")
	cmd.Env = append(os.Environ(), "LIMIT=128", "KEYS=200000", "HOT=24", "DURATION=1s")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if s := string(out); strings.HasPrefix(s, "SKIP:") {
		t.Skip(strings.TrimSpace(s))
	}
	require.NoError(t, err)
	require.Contains(t, string(out), "RESULT spillcache built: served 100.0% of 200000 entries")
	require.Contains(t, string(out), "RESULT otter not built: killed by the kernel's OOM killer")
	require.Contains(t, string(out), "PASS:")
}
