package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/pool"
)

// TestSegmentsSharers: `memctl segments` counts a shared segment's
// attachments (alloc.Shared) that its home's directory heard from.
func TestSegmentsSharers(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	ctx := t.Context()
	var segs []*alloc.Segment
	for i := range 3 {
		c, err := alloc.Dial(ctx, cfg.Socket)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		if i == 0 {
			_, err = c.Alloc(ctx, 4096, alloc.WithName("board"), alloc.WithTier(alloc.TierRDMA))
			require.NoError(t, err)
			_, err = c.Alloc(ctx, 4096, alloc.WithName("plain"), alloc.WithTier(alloc.TierRDMA))
			require.NoError(t, err)
		}
		if i == 2 {
			break // a client that does not attach
		}
		s, err := c.Attach(ctx, "board", alloc.Shared())
		require.NoError(t, err)
		_, err = s.Load64(0)
		require.NoError(t, err)
		segs = append(segs, s)
	}

	out, _, code := memctl(t, cfg.Socket, "segments", "-o", "json")
	require.Zero(t, code)
	var list []segmentJSON
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	got := map[string]uint32{}
	for _, s := range list {
		got[s.Name] = s.Sharers
	}
	require.Equal(t, map[string]uint32{"board": 2, "plain": 0}, got)

	out, _, code = memctl(t, cfg.Socket, "segments")
	require.Zero(t, code)
	require.Contains(t, out, "SHARERS")
	require.Regexp(t, regexp.MustCompile(`(?m)^\d+\s+board\s.*\s2\s+\S+\s+\S+$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^\d+\s+plain\s.*\s-\s+\S+\s+\S+$`), out)
	for _, s := range segs {
		require.NoError(t, s.Shared().Detach(ctx))
	}
}

// TestSegmentsGrants: `memctl alloc --allow/--allow-free` grants a name to
// other identities, `memctl segments` shows who may attach it (ACCESS;
// creator, allow and allow_free in -o json), and a malformed identity is
// refused with the forms that work.
func TestSegmentsGrants(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	_, errOut, code := memctl(t, cfg.Socket, "alloc", "--size", "1MiB", "--tier", "cxl", "--name", "granted",
		"--allow", "cn:app2,gid:100", "--allow-free", "cn:ops")
	require.Zero(t, code, errOut)
	me := "uid:" + strconv.Itoa(os.Getuid())

	out, _, code := memctl(t, cfg.Socket, "segments", "-o", "json")
	require.Zero(t, code)
	var list []segmentJSON
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list, 1)
	require.Equal(t, me, list[0].Creator)
	require.Equal(t, []string{"cn:app2", "gid:100"}, list[0].Allow)
	require.Equal(t, []string{"cn:ops"}, list[0].AllowFree)

	out, _, code = memctl(t, cfg.Socket, "segments")
	require.Zero(t, code)
	require.Contains(t, out, "ACCESS")
	require.Contains(t, out, me+",+cn:app2,+gid:100,+cn:ops(free)")

	_, errOut, code = memctl(t, cfg.Socket, "alloc", "--size", "1MiB", "--name", "bad", "--allow", "app2")
	require.NotZero(t, code)
	require.Contains(t, errOut, `identity "app2": use uid:N or gid:N`)
}

// TestSegmentsPaged: `memctl segments` lists a table of 100,000 segments,
// more than one gRPC message holds, page by page, each once, in id order;
// a client from before paging (no page_size) gets what fits in one message
// and a token for the rest. The table is seeded into the store before the
// daemon starts (pool.SeedSegments): allocating 100,000 segments through
// the control plane takes minutes with -race.
func TestSegmentsPaged(t *testing.T) {
	const n = 100_000
	cfg := pooltest.Config(t)
	_, err := pool.SeedSegments(cfg.DataDir, n, "seed-peer")
	require.NoError(t, err)
	pooltest.Start(t, cfg)
	// Allocated ones list beside them.
	pooltest.Fill(t, cfg.Socket, 10, 4096, poolv1.Tier_TIER_CXL)

	start := time.Now()
	out, errOut, code := memctl(t, cfg.Socket, "segments")
	t.Logf("memctl segments with %d segments took %s (%d bytes)", n+10, time.Since(start), len(out))
	require.Zero(t, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1+n+10, "a header and each segment")
	var prev uint64
	inOrder := true
	for _, l := range lines[1:] {
		id, err := strconv.ParseUint(strings.Fields(l)[0], 10, 64)
		require.NoError(t, err, l)
		inOrder = inOrder && id > prev
		prev = id
	}
	require.True(t, inOrder, "in id order, each once")

	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	resp, err := poolv1.NewPoolClient(conn).List(t.Context(), &poolv1.ListRequest{})
	require.NoError(t, err, "an old client's List fits in one message")
	require.NotEmpty(t, resp.NextPageToken)
	require.Less(t, proto.Size(resp), 4<<20)
	t.Logf("a List without page_size returns %d segments (%d bytes)", len(resp.Segments), proto.Size(resp))
}
