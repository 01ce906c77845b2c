package alloc

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestFarFailureBlamesNoPoold: an operation that fails because a far home
// does not answer, or because a redundant segment's homes cannot serve it,
// while the client's own poold is up, matches ErrUnavailable (callers
// retry on it) but its message names what failed and never sends the user
// to start poold; a home on the client's own poold that does not answer
// still does.
func TestFarFailureBlamesNoPoold(t *testing.T) {
	const chunk = 4096
	for _, tc := range []struct {
		name string
		// fail makes the segment's failure and returns the operation's error.
		fail func(t *testing.T) error
		want string // a phrase the message must contain
		own  bool   // the home is the client's own poold
	}{
		{"remote home down", func(t *testing.T) error {
			f := startFakeHomesAs(t, Replicas(1), 1<<16, 1<<16, tcp.DefaultConfig(), nil, func(info *poolv1.Segment) {
				h := info.Homes[0]
				info.DataAddr, info.Key, info.Epoch = h.DataAddr, h.Key, h.Epoch
			})
			f.srvs[0].Close()
			_, err := f.seg.ReadAt(make([]byte, 64), 0)
			return err
		}, "far memory home unreachable", false},
		{"home on the own poold down", func(t *testing.T) error {
			own := pooltest.Config(t).Node // the node startFakeHomes's daemon runs as
			f := startFakeHomesAs(t, Replicas(1), 1<<16, 1<<16, tcp.DefaultConfig(), nil, func(info *poolv1.Segment) {
				h := info.Homes[0]
				info.Node, info.DataAddr, info.Key, info.Epoch = own, h.DataAddr, h.Key, h.Epoch
			})
			require.Equal(t, own, f.seg.c.Node())
			f.srvs[0].Close()
			_, err := f.seg.ReadAt(make([]byte, 64), 0)
			return err
		}, "is poold running", true},
		{"every copy down", func(t *testing.T) error {
			f := startFakeHomes(t, Replicas(2), 1<<16, 1<<16, tcp.DefaultConfig())
			for _, s := range f.srvs {
				s.Close()
			}
			_, err := f.seg.ReadAt(make([]byte, 64), 0)
			return err
		}, "redundant segment unavailable", false},
		{"too few shards to decode", func(t *testing.T) error {
			f := startFakeHomes(t, ErasureCoded(2, 1), 2*chunk, 2*2*chunk, tcp.DefaultConfig())
			f.srvs[0].Close()
			f.srvs[1].Close()
			_, err := f.seg.ReadAt(make([]byte, 64), 0)
			return err
		}, "redundant segment unavailable", false},
		{"lost shard write refused by a busy daemon", func(t *testing.T) error {
			f, _ := lostShardRefusingWrites(t)
			_, err := f.seg.WriteAt(make([]byte, 10), 0)
			return err
		}, "redundant segment unavailable", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.fail(t)
			t.Log(err)
			require.ErrorIs(t, err, ErrUnavailable, "callers retry on ErrUnavailable")
			if !tc.own {
				require.NotContains(t, err.Error(), "is poold running", "the local poold is up; a far home or the segment's redundancy failed")
			}
			require.Contains(t, err.Error(), tc.want)
		})
	}
}
