package pool

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	redspec "github.com/farmem/farmem/internal/redundancy"
)

// FuzzReplicateRequest: a peer's Replicate request, as bytes, either is
// refused with ErrInvalid or has a known mode, at most MaxHomes targets
// and writers, a key and an address on every target not lost, and for
// parity a shard below k and one target per parity shard; never a panic.
// The seed corpus is testdata/fuzz/FuzzReplicateRequest.
func FuzzReplicateRequest(f *testing.F) {
	key := make([]byte, 16)
	for _, req := range []*poolv1.ReplicateRequest{
		{HomeId: 1, Epoch: 1, Targets: []*poolv1.SegmentHome{{Node: "b", HomeId: 2, DataAddr: "10.0.0.2:7960", Key: key, Epoch: 1}}},
		{HomeId: 1, Epoch: 2, Writers: []string{"a"}, ClientsReadOnly: true},
		{HomeId: 3, Mode: poolv1.ForwardMode_FORWARD_MODE_PARITY, Shard: 1, DataShards: 2, ParityShards: 1,
			Targets: []*poolv1.SegmentHome{{State: poolv1.HomeState_HOME_STATE_LOST}}},
		{HomeId: 3, Mode: 7, Writers: []string{"a/b", ""}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req poolv1.ReplicateRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		if err := validReplicate(&req); err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("validReplicate(%v) = %v, not ErrInvalid", &req, err)
			}
			return
		}
		if len(req.Targets) > redspec.MaxHomes || len(req.Writers) > redspec.MaxHomes {
			t.Fatalf("accepted %d targets and %d writers", len(req.Targets), len(req.Writers))
		}
		for _, tg := range req.Targets {
			if tg.State != poolv1.HomeState_HOME_STATE_LOST && (len(tg.Key) != 16 || tg.DataAddr == "" || tg.Node == "") {
				t.Fatalf("accepted target %v", tg)
			}
		}
		switch req.Mode {
		case poolv1.ForwardMode_FORWARD_MODE_COPY:
		case poolv1.ForwardMode_FORWARD_MODE_PARITY:
			if req.Shard >= req.DataShards || len(req.Targets) != int(req.ParityShards) {
				t.Fatalf("accepted parity request %v", &req)
			}
		default:
			t.Fatalf("accepted mode %d", req.Mode)
		}
	})
}
