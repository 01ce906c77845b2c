package pool

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// FuzzAllocRequest is the control plane's request validation under
// arbitrary input: bytes decoded as an allocRequest, as the descriptor
// channel decodes them, then Alloc, Attach by the request's name, and
// Free, for a client and for an administrator; grants only with a name
// and of well-formed identities. No input panics; every
// refusal matches one of the sentinels a client can act on; every
// allocation is the segment asked for, inside its device, and freeing it
// gives all capacity back. The seed corpus is testdata/fuzz/FuzzAllocRequest.
func FuzzAllocRequest(f *testing.F) {
	for _, req := range []*poolv1.AllocRequest{
		{Size: 4096, Tier: poolv1.Tier_TIER_CXL},
		{Size: 1, Tier: poolv1.Tier_TIER_LOCAL, Name: "cache-0", Persist: true},
		{Size: 1 << 30, Tier: poolv1.Tier_TIER_CXL, Fallback: []poolv1.Tier{poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_RDMA}},
		{Size: -1, Tier: 99, Name: "a b"},
		{Size: 8192, HomeOnly: true},
		{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "g", Allow: []string{"cn:app2", "gid:7"}, AllowFree: []string{"uid:0"}},
		{Size: 4096, Allow: []string{"cn:app2"}},
		{Size: 4096, MaxReadLatencyNs: 2000},
		{Size: 4096, Tier: poolv1.Tier_TIER_CXL, MaxReadLatencyNs: -5, MinReadBandwidthBps: -1},
		{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true, Redundancy: &poolv1.Redundancy{Replicas: 2}},
		{Size: 10000, Tier: poolv1.Tier_TIER_RDMA, Name: "ec", Redundancy: &poolv1.Redundancy{DataShards: 4, ParityShards: 2, AllowFallback: true}},
		{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Redundancy: &poolv1.Redundancy{Replicas: 1 << 31, DataShards: 3}},
	} {
		b, err := proto.Marshal(req)
		require.NoError(f, err)
		f.Add(b, false)
	}
	cfg := testConfig(f)
	cfg.MetadataFsync = false // thousands of commits; durability is not what this checks
	p := newTestPool(f, cfg)
	f.Cleanup(func() { p.close() })
	p.openSession("s", "fuzz-client", "", "fuzz", 1, 0)
	client, err := p.callerFor("s")
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, b []byte, asAdmin bool) {
		var req poolv1.AllocRequest
		if proto.Unmarshal(b, &req) != nil {
			return // the channel answers ErrInvalid before validation
		}
		c := client
		if asAdmin {
			c = admin()
		}
		r, err := p.Alloc(t.Context(), c, allocRequestOf(&req))
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrNoCapacity) && !errors.Is(err, errs.ErrExists) && !errors.Is(err, errs.ErrLimit) {
				t.Fatalf("Alloc(%v) refused with %v, which matches no sentinel", &req, err)
			}
			return
		}
		require.Equal(t, req.Size, r.Size)
		require.Equal(t, req.Name, r.Name)
		require.Equal(t, req.Allow, r.Allow)
		require.Equal(t, req.AllowFree, r.AllowFree)
		require.NotNil(t, r.placement, "every placement says why")
		d := p.device(r.Device)
		require.NotNil(t, d)
		require.GreaterOrEqual(t, r.Extent, r.Size)
		require.LessOrEqual(t, r.Offset+r.Extent, d.ext.Stats().Capacity)
		if req.Name != "" {
			a, err := p.Attach(c, req.Name)
			require.NoError(t, err)
			require.Equal(t, r.ID, a.ID)
		}
		require.NoError(t, p.Free(c, r.ID, ""))
		for _, ti := range p.tiers() {
			require.Equal(t, ti.Capacity, ti.Free, "%s after freeing the only segment", ti.Tier)
		}
	})
}
