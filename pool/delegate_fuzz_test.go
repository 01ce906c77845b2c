package pool

import (
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// FuzzDelegateRequest feeds a peer's Delegate and Authorize requests, as
// their bytes arrive, to validation and then to the credential table and
// the segment table of a pool where that peer owns one segment: every
// refusal is a sentinel; a delegated credential identifies as the peer's
// client and nothing else, and a withdrawn one as nobody; an authorization changes only that segment's
// delegates, and only as asked (with sets: replaced by the last set that
// names it; the owner and the writers kept).
func FuzzDelegateRequest(f *testing.F) {
	for _, m := range []proto.Message{
		&poolv1.DelegateRequest{ClientId: "app", Identity: "cn:app"},
		&poolv1.DelegateRequest{ClientId: "app", Identity: "uid:1000"},
		&poolv1.DelegateRequest{ClientId: "poold/b", Identity: "cn:b"},
		&poolv1.DelegateRequest{ClientId: "", Identity: "insecure"},
		&poolv1.DelegateRequest{ClientId: "app", Withdraw: true},
		&poolv1.DelegateRequest{ClientId: "app", Identity: "cn:app", Withdraw: true},
		&poolv1.DelegateRequest{ClientId: "app", Identity: "uid:1000", Binding: 7},
		&poolv1.DelegateRequest{ClientId: "app", Withdraw: true, Binding: 1<<64 - 1},
		&poolv1.AuthorizeRequest{Ids: []uint64{1}, ClientId: "app"},
		&poolv1.AuthorizeRequest{Ids: []uint64{1, 99}, ClientId: "app", Withdraw: true},
		&poolv1.AuthorizeRequest{Ids: []uint64{99}, ClientId: "x"},
		&poolv1.AuthorizeRequest{Sets: []*poolv1.SegmentClients{{Id: 1, ClientIds: []string{"app", "b", "app"}}, {Id: 99}}},
		&poolv1.AuthorizeRequest{Sets: []*poolv1.SegmentClients{{Id: 1}}},
		&poolv1.AuthorizeRequest{Sets: []*poolv1.SegmentClients{{Id: 1, ClientIds: []string{"poold/x"}}}},
		&poolv1.AuthorizeRequest{Ids: []uint64{1}, ClientId: "app", Sets: []*poolv1.SegmentClients{{Id: 1, ClientIds: []string{"app"}}}},
	} {
		b, err := proto.Marshal(m)
		require.NoError(f, err)
		_, authorize := m.(*poolv1.AuthorizeRequest)
		f.Add(b, authorize)
	}
	cfg := testConfig(f)
	cfg.MetadataFsync = false
	p := newTestPool(f, cfg)
	f.Cleanup(func() { p.close() })
	const peer = peerClientPrefix + "a"
	p.openSession("s", peer, "", "poold a", 1, 0)
	c, err := p.callerFor("s")
	require.NoError(f, err)
	seg, err := p.Alloc(f.Context(), c, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, HomeOnly: true, ForClient: "app"})
	require.NoError(f, err)
	require.Equal(f, []string{"app"}, seg.Delegates)

	f.Fuzz(func(t *testing.T, b []byte, authorize bool) {
		if authorize {
			var req poolv1.AuthorizeRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			before, _ := p.Stat(seg.ID)
			err := p.authorizeRequest(c, &req)
			after, _ := p.Stat(seg.ID)
			if err != nil {
				if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrLimit) && !errors.Is(err, errs.ErrAccessDenied) {
					t.Fatalf("Authorize(%v) refused with %v, which matches no sentinel", &req, err)
				}
				require.Equal(t, before.Delegates, after.Delegates)
				return
			}
			if slices.Contains(req.Ids, seg.ID) {
				require.Equal(t, !req.Withdraw, slices.Contains(after.Delegates, req.ClientId))
			}
			var last *poolv1.SegmentClients
			for _, set := range req.Sets {
				if set.Id == seg.ID {
					last = set
				}
			}
			if last != nil {
				require.ElementsMatch(t, slices.Compact(slices.Sorted(slices.Values(last.ClientIds))), after.Delegates, "a set replaces the delegates")
			}
			require.Equal(t, before.Owner, after.Owner)
			require.Equal(t, before.Writers, after.Writers)
			return
		}
		var req poolv1.DelegateRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		principal := delegatedPrincipal(peer, req.ClientId)
		held := p.auth.credOf(principal)
		p.auth.mu.Lock()
		heldFor := p.auth.creds[string(held)]
		p.auth.mu.Unlock()
		resp, err := p.delegateRequest("s", peer, &req)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrLimit) && !errors.Is(err, errs.ErrLeaseExpired) {
				t.Fatalf("Delegate(%v) refused with %v, which matches no sentinel", &req, err)
			}
			return
		}
		if req.Withdraw {
			require.Empty(t, resp.DataCredential)
			if held != nil && (req.Binding == 0 || heldFor.binding <= req.Binding) {
				_, _, err := p.auth.identify(held, nil)
				require.Error(t, err, "a withdrawn credential identifies nobody")
			}
			return
		}
		got, _, err := p.auth.identify(resp.DataCredential, nil)
		require.NoError(t, err)
		require.Equal(t, principal, got)
	})
}
