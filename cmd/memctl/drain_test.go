package main

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
)

// memctl drain says what a drain does and does not do, keeps the first
// start of a repeated drain, holds across a daemon restart, says that an
// undo of a node not draining changed nothing, and names the known node
// when asked for another; status and nodes show the drain and its start.
func TestDrainMessages(t *testing.T) {
	cfg := pooltest.Config(t)
	d := pooltest.Start(t, cfg)
	s := cfg.Socket
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := memctl(t, s, args...)
		require.Zero(t, code, "memctl %v: %s", args, errOut)
		return out
	}

	out := run("drain", "test-node")
	m := regexp.MustCompile(`^test-node is draining since (\S+) \(\S+ ago\): no new placements; its segments stay unless --evacuate moves them\n$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	since := m[1]
	require.Contains(t, run("drain", "test-node"), "test-node was already draining since "+since)

	// A restarted daemon drains on, since the same time.
	require.NoError(t, d.Close())
	pooltest.Start(t, cfg)
	require.Contains(t, run("status"), "node test-node is draining since "+since)
	var st struct {
		Draining bool    `json:"draining"`
		Since    *string `json:"draining_since"`
	}
	require.NoError(t, json.Unmarshal([]byte(run("status", "-o", "json")), &st))
	require.True(t, st.Draining)
	require.Equal(t, since, *st.Since)
	var nodes []nodeJSON
	require.NoError(t, json.Unmarshal([]byte(run("nodes", "-o", "json")), &nodes))
	require.Len(t, nodes, 1)
	require.True(t, nodes[0].Draining)
	require.Equal(t, since, nodes[0].DrainingSince)
	require.Contains(t, run("nodes"), "alive,draining")

	require.Equal(t, "test-node accepts placements again\n", run("drain", "test-node", "--undo"))
	require.Equal(t, "test-node was not draining; nothing to undo\n", run("drain", "test-node", "--undo"))
	var undo struct {
		Draining, Changed bool
		Since             *string `json:"draining_since"`
	}
	require.NoError(t, json.Unmarshal([]byte(run("drain", "test-node", "--undo", "-o", "json")), &undo))
	require.False(t, undo.Draining)
	require.False(t, undo.Changed)
	require.Nil(t, undo.Since)
	st.Since = nil
	require.NoError(t, json.Unmarshal([]byte(run("status", "-o", "json")), &st))
	require.False(t, st.Draining)
	require.Nil(t, st.Since)
	require.NotContains(t, run("status"), "draining")

	_, errOut, code := memctl(t, s, "drain", "nope")
	require.NotZero(t, code)
	require.Contains(t, errOut, `node "nope": not found: this daemon is in no cluster; its only node is "test-node"`)

	// Evacuation needs other hosts, and contradicting flags are refused
	// before anything is asked.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"drain", "test-node", "--evacuate"}, "invalid argument: node test-node is in no cluster (poold without --gossip): there is no other host to evacuate to"},
		{[]string{"drain", "test-node", "--undo", "--evacuate"}, "invalid argument: --undo ends the drain and its evacuation; drop --evacuate and --wait"},
		{[]string{"drain", "test-node", "--wait"}, "invalid argument: --wait waits for an evacuation; add --evacuate"},
		{[]string{"drain", "test-node", "--evacuate", "--wait", "--stuck-grace", "0s"}, "invalid argument: --stuck-grace 0s: give a positive duration, e.g. 30s"},
	} {
		_, errOut, code = memctl(t, s, tc.args...)
		require.NotZero(t, code, "%v", tc.args)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	require.NotContains(t, run("status"), "draining", "a refused evacuation drains nothing")
}

// The evacuation's lines: progress with its rate and ETA, failures being
// retried, a stuck evacuation with its reason, the end, and the segments
// of the node's own applications, which stay.
func TestEvacuationText(t *testing.T) {
	for _, tc := range []struct {
		ev   *poolv1.Evacuation
		want string
	}{
		{nil, "d: the evacuation is starting"},
		{&poolv1.Evacuation{SegmentsMoved: 3, BytesMoved: 3 << 20, SegmentsLeft: 5, BytesLeft: 5 << 20, BytesPerSecond: 2.5e6, EtaMs: 2100},
			"d: moved 3 segments (3.0 MiB), left 5 (5.0 MiB), 2.5 MB/s, ETA 2s"},
		{&poolv1.Evacuation{SegmentsLeft: 5, BytesLeft: 5 << 20, SegmentsFailed: 2},
			"d: moved 0 segments (0 B), left 5 (5.0 MiB), 0.0 MB/s, ETA unknown, 2 failed (retrying)"},
		{&poolv1.Evacuation{SegmentsLeft: 1, BytesLeft: 64 << 20, SegmentsFailed: 1, Stuck: "no other host has room for 64.0 MiB (1 segment waits)"},
			"d: 1 segments (64.0 MiB) left to move, stuck: no other host has room for 64.0 MiB (1 segment waits)"},
		{&poolv1.Evacuation{SegmentsMoved: 64, BytesMoved: 1 << 30, BytesPerSecond: 29.5e6, Done: true, SegmentsStaying: 2, BytesStaying: 8 << 20},
			"d is evacuated: no segment of a peer is left on it (moved 64 segments, 1.0 GiB, at 29.5 MB/s); 2 segments (8.0 MiB) of d's own applications stay (they leave with their applications)"},
	} {
		require.Equal(t, tc.want, evacuationText("d", tc.ev))
	}
}
