package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// SessionHeader is the gRPC metadata key that names the caller's session.
const SessionHeader = "farmem-session"

// Version is poold's version, shown by memctl status.
var Version = "0.1.0-dev"

// service implements the gRPC Pool service over the core.
type service struct {
	poolv1.UnimplementedPoolServer
	d *Daemon
}

var _ poolv1.PoolServer = (*service)(nil)

// caller resolves who makes the call: the session named in the call's
// metadata, or an administrator (see Daemon.callerOf).
func (s *service) caller(ctx context.Context) (caller, error) {
	t, _ := identityOf(ctx)
	return s.d.callerOf(sessionOf(ctx), t)
}

// sessionOf is the session a call's metadata names ("" for none).
func sessionOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(SessionHeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (s *service) Session(stream grpc.BidiStreamingServer[poolv1.SessionRequest, poolv1.SessionResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return errs.ToStatus(err)
	}
	hello := first.GetHello()
	if hello == nil || hello.ClientId == "" || len(hello.ClientId) > MaxNameLen || hello.ClientId == nobody.id {
		return errs.ToStatus(fmt.Errorf("%w: a session starts with a Hello carrying a client id of 1 to %d bytes", errs.ErrInvalid, MaxNameLen))
	}
	if len(hello.ClientName) > MaxNameLen {
		return errs.ToStatus(fmt.Errorf("%w: client name of %d bytes is longer than %d; choose a shorter one (alloc.WithClientName)", errs.ErrInvalid, len(hello.ClientName), MaxNameLen))
	}
	t, uid := identityOf(stream.Context())
	ident := t.ident
	if err := s.d.bindSession(hello.ClientId, t); err != nil {
		return errs.ToStatus(err)
	}
	if hook := s.d.cfg.sim.sessionBound; hook != nil {
		hook(hello.ClientId)
	}
	sid := newSessionID()
	cred := s.d.pool.credentials().issue(sid, hello.ClientId, ident)
	defer s.d.pool.credentials().revokeSession(sid)
	events, reclaimed := s.d.pool.openSession(sid, hello.ClientId, ident, hello.ClientName, hello.Pid, uid)
	defer s.d.pool.closeSession(sid)
	// The Welcome tells the reclaimed segments; they count as told once the
	// client's first keep-alive arrives, which it sends only after it took
	// the Welcome in (a sent Welcome is only queued: a connection that
	// breaks right after may lose it). Until then a session's end puts them
	// back for the next one, which may tell them twice (harmless: segment
	// ids are never reused).
	told := false
	defer func() {
		if !told && len(reclaimed) > 0 {
			s.d.pool.unreclaimedTold(hello.ClientId, ident, reclaimed)
		}
	}()
	// The session holds the client's lease now. A reap of its lapsed lease
	// between the bind and here, once its last segments went, forgot the
	// binding, and every call of this session would then be refused as
	// another identity's: bind again (refused if another identity took the
	// id meanwhile).
	if s.d.pool.credentials().identity(hello.ClientId) != ident {
		if err := s.d.bindSession(hello.ClientId, t); err != nil {
			return errs.ToStatus(err)
		}
	}
	s.d.log.Debug("session opened", "session", sid, "client", hello.ClientId, "name", hello.ClientName, "pid", hello.Pid)
	err = stream.Send(&poolv1.SessionResponse{Msg: &poolv1.SessionResponse_Welcome{Welcome: &poolv1.Welcome{
		SessionId: sid, LeaseTtlMs: s.d.cfg.LeaseTTL.Milliseconds(), Node: s.d.cfg.Node, DataCredential: cred,
		Reclaimed: reclaimed,
	}}})
	if err != nil {
		return err
	}
	// One goroutine receives; this one sends (a gRPC stream allows one
	// sender at a time): keep-alive acks and segment notices.
	recvErr := make(chan error, 1)
	keepAlive := make(chan struct{}, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if m.GetKeepAlive() != nil {
				s.d.metrics.leaseRenewed()
				select {
				case keepAlive <- struct{}{}:
				default:
				}
			}
		}
	}()
	for {
		var out *poolv1.SessionResponse
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-keepAlive:
			told = true
			out = &poolv1.SessionResponse{Msg: &poolv1.SessionResponse_Ack{Ack: &poolv1.KeepAliveAck{}}}
		case ev := <-events:
			out = &poolv1.SessionResponse{Msg: &poolv1.SessionResponse_Events{Events: ev}}
		case <-s.d.stop:
			return errs.ToStatus(fmt.Errorf("poold is shutting down: %w", errs.ErrUnavailable))
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *service) Alloc(ctx context.Context, req *poolv1.AllocRequest) (*poolv1.Segment, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	seg, err := s.d.alloc(ctx, c, req)
	return seg, errs.ToStatus(err)
}

// alloc serves an allocation from either path (gRPC, or the local fast
// path on the descriptor channel).
func (d *Daemon) alloc(ctx context.Context, c caller, req *poolv1.AllocRequest) (*poolv1.Segment, error) {
	if len(req.Name) > d.cfg.MaxNameLen {
		return nil, fmt.Errorf("%w: segment name of %d bytes is longer than max-name-len %d; use a shorter name or raise --max-name-len (at most %d)", errs.ErrLimit, len(req.Name), d.cfg.MaxNameLen, MaxNameLen)
	}
	r, err := d.pool.Alloc(ctx, c, allocRequestOf(req))
	if err == nil && ctx.Err() != nil {
		r, err = nil, d.abandoned(c, r, ctx.Err())
	}
	d.metrics.allocDone(r, err)
	if err != nil {
		return nil, err
	}
	seg := d.forCaller(ctx, c, *r)
	seg.Placement = r.placement
	return seg, nil
}

// allocRequestOf is what an API request asks of core.Alloc.
func allocRequestOf(req *poolv1.AllocRequest) allocRequest {
	return allocRequest{Size: req.Size, Tier: req.Tier, Name: req.Name, Persist: req.Persist, Fallback: req.Fallback,
		HomeOnly: req.HomeOnly, FilledByCopy: req.FilledByCopy, Allow: req.Allow, AllowFree: req.AllowFree, ForClient: req.ForClient,
		MaxReadLatencyNs: req.MaxReadLatencyNs, MinReadBandwidthBps: req.MinReadBandwidthBps, Redundancy: specOf(req.Redundancy)}
}

// abandoned frees a segment allocated for a caller that gave up meanwhile
// (its deadline passed, or it went away): it never learns the segment's
// id, and the segment would stay leased to its live session, or to the
// peer daemon that asked, until that session ends. The scale simulation
// found such segments outliving a partition by minutes (docs/scale.md).
// An answer lost after this check is left to the peer sweep and the lease.
func (d *Daemon) abandoned(c caller, r *record, why error) error {
	if err := d.pool.Free(c, r.ID, ""); err != nil {
		d.log.Warn("free a segment whose caller gave up before the answer", "segment", r.ID, "err", err)
	} else {
		d.log.Debug("freed a segment whose caller gave up before the answer", "segment", r.ID, "owner", r.Owner)
	}
	return fmt.Errorf("alloc: the caller gave up before the answer; the segment was freed: %w", why)
}

func (s *service) Free(ctx context.Context, req *poolv1.FreeRequest) (*poolv1.FreeResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	if req.Id == 0 && req.Name == "" {
		return nil, errs.ToStatus(fmt.Errorf("%w: free needs a segment id or name", errs.ErrInvalid))
	}
	if err := s.d.free(c, req.Id, req.Name); err != nil {
		return nil, errs.ToStatus(err)
	}
	return &poolv1.FreeResponse{}, nil
}

// free serves a free from either path.
func (d *Daemon) free(c caller, id uint64, name string) error {
	err := d.pool.Free(c, id, name)
	if err != nil {
		d.refused("free", c, id, name, err)
	}
	return err
}

func (s *service) Attach(ctx context.Context, req *poolv1.AttachRequest) (*poolv1.Segment, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	r, err := s.d.pool.Attach(c, req.Name)
	if err == nil {
		// The attachment stays recorded and the homes are told in the
		// background: a retried Attach then answers as soon as they were
		// told, and the caller's credentials work there from then on.
		if terr := s.d.pool.tellHomes(ctx, r.ID); terr != nil {
			s.d.pool.tellLater(r.ID)
			err = fmt.Errorf("attach %q: the attachment is recorded, but %v; the daemon keeps telling the home in the background: retry Attach, which succeeds once it was told, or Detach to withdraw: %w", req.Name, terr, errs.ErrHomeUnreachable)
		}
	}
	if err != nil {
		s.d.refused("attach", c, 0, req.Name, err)
		return nil, errs.ToStatus(err)
	}
	return s.d.forCaller(ctx, c, *r), nil
}

func (s *service) Detach(ctx context.Context, req *poolv1.DetachRequest) (*poolv1.DetachResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	if err := s.d.pool.Detach(c, req.Id); err != nil {
		return nil, errs.ToStatus(err)
	}
	if err := s.d.pool.tellHomes(ctx, req.Id); err != nil {
		s.d.log.Warn("detach: a home of the segment was not told; retrying in the background (the client may use the segment there until it is told)", "segment", req.Id, "client", c.id(), "err", err)
		s.d.pool.tellLater(req.Id)
	}
	return &poolv1.DetachResponse{}, nil
}

func (s *service) Stat(ctx context.Context, req *poolv1.StatRequest) (*poolv1.Segment, error) {
	c := s.viewer(ctx)
	denied := func() error {
		// Ids are not secrets, but what they hold is: nothing of it.
		err := fmt.Errorf("segment %d: %w", req.Id, errs.ErrAccessDenied)
		s.d.refused("stat", c, req.Id, "", err)
		return errs.ToStatus(err)
	}
	if req.Settled {
		// Who may see the segment is checked before the wait: a caller
		// that may not learns nothing of its moves (whether one is under
		// way, when it ends) and holds no wait on them.
		if r, err := s.d.pool.Stat(req.Id); err == nil && !s.d.visible(c, &r) {
			return nil, denied()
		}
		if err := s.d.pool.moving.awaitIdle(ctx, req.Id); err != nil {
			return nil, errs.ToStatus(err)
		}
	}
	r, ok := s.d.pool.moving.awaitSwitch(ctx, req.Id)
	var err error
	if !ok {
		r, err = s.d.pool.Stat(req.Id)
	}
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	if !s.d.visible(c, &r) {
		return nil, denied()
	}
	return s.d.forCaller(ctx, c, r), nil
}

func (s *service) Tiers(ctx context.Context, _ *poolv1.TiersRequest) (*poolv1.TiersResponse, error) {
	return &poolv1.TiersResponse{Tiers: s.d.pool.allTiers()}, nil
}

func (s *service) MeasureTiers(ctx context.Context, _ *poolv1.MeasureTiersRequest) (*poolv1.TiersResponse, error) {
	if err := s.d.MeasureTiers(ctx); err != nil {
		return nil, errs.ToStatus(err)
	}
	return &poolv1.TiersResponse{Tiers: s.d.pool.allTiers()}, nil
}

func (s *service) Status(ctx context.Context, _ *poolv1.StatusRequest) (*poolv1.StatusResponse, error) {
	p := s.d.pool
	ds := p.drainState()
	return &poolv1.StatusResponse{
		Version: Version, Node: s.d.cfg.Node, StartedUnixMs: p.startTime().UnixMilli(), Pid: int64(os.Getpid()),
		DataDir: s.d.cfg.DataDir, Socket: s.d.cfg.Socket, Tiers: p.allTiers(), Sessions: int64(p.sessionCount()),
		Segments: int64(p.segmentCount()), LeaseTtlMs: s.d.cfg.LeaseTTL.Milliseconds(),
		Clients: s.d.withIdentities(p.clientInfos()), Ops: s.d.metrics.tierOps(),
		Insecure: s.d.cfg.Insecure && s.d.cfg.Listen != "", Quotas: p.quotaUsage(),
		NameConflicts:       p.nameConflicts(),
		GossipInsecure:      s.d.cfg.Gossip != "" && s.d.cfg.GossipKeyFile == "",
		DataSecurity:        s.d.data.note,
		DrainingSinceUnixMs: unixMs(ds.since),
		Zone:                s.d.cfg.Zone,
		Evacuating:          !ds.evacSince.IsZero(),
		Evacuation:          p.evac.progress(),
		GossipCluster:       s.d.cfg.GossipCluster,
	}, nil
}

// dataTLS tells a client of an rdma segment whether its home serves the
// data plane over TLS, and how to verify it: this node's CA (one CA signs
// every node of a cluster) and the home's node name, which its certificate
// holds.
func (d *Daemon) dataTLS(seg *poolv1.Segment, on bool, home string) {
	if on {
		seg.DataTls, seg.DataTlsCa, seg.DataServerName = true, d.data.ca, home
	}
}

// segmentProto describes a record for the API.
func (d *Daemon) segmentProto(r record) *poolv1.Segment {
	seg := &poolv1.Segment{
		Id: r.ID, Name: r.Name, Device: r.Device, Node: d.cfg.Node, NumaNode: -1, Offset: r.Offset, Size: r.Size,
		Owner: r.Owner, State: poolv1.SegmentState_SEGMENT_STATE_ACTIVE, Epoch: r.Epoch,
		CreatedUnixMs: r.Created.UnixMilli(), Persist: r.Persist, Attached: r.Attached,
		Creator: r.Creator, Allow: r.Allow, AllowFree: r.AllowFree, Tier: r.Tier,
	}
	dp := d.pool.data()
	if r.Lost {
		seg.State = poolv1.SegmentState_SEGMENT_STATE_LOST
	}
	if dv := d.pool.deviceNamed(r.Device); dv != nil {
		seg.Kind, seg.Emulated, seg.NumaNode, seg.SharesFd = dv.kindName(), dv.isEmulated(), int32(dv.Node()), dv.SharesFD()
		seg.PowerSafe = dv.powerSafe && r.Home == ""
	}
	switch {
	case r.Home != "":
		key := r.Key
		seg.Node, seg.DataAddr, seg.Key, seg.HomeId, seg.Transport = r.Home, r.DataAddr, key[:], r.HomeID, "tcp"
		seg.Kind, seg.Device = "tcp", "peer:"+r.Home
		// A record older than the field: the home is taken to serve as
		// this node does (one configuration for the cluster).
		on := d.data.server != nil
		if r.DataTLS != nil {
			on = *r.DataTLS
		}
		d.dataTLS(seg, on, r.Home)
	case !r.Key.IsZero() && dp != nil:
		key := r.Key
		seg.DataAddr, seg.Key, seg.HomeId, seg.Transport = dp.addr, key[:], r.ID, "tcp"
		d.dataTLS(seg, dp.tls != nil, d.cfg.Node)
		if strings.HasPrefix(r.Owner, peerClientPrefix) {
			seg.Kind, seg.Emulated = "lent", false // this host's memory, lent to a peer
		}
	}
	if r.redundant() {
		seg.Redundancy, seg.RedundancyState, seg.ShardChunk = redundancyProto(r.Redundancy), r.redundancyState(), r.ShardChunk
		for _, h := range r.Homes {
			hp := homeProto(h)
			if h.DataTLS {
				hp.DataTlsCa, hp.DataServerName = d.data.ca, h.Node
			}
			seg.Homes = append(seg.Homes, hp)
		}
		d.pool.moving.markMoving(r.ID, seg.Homes)
	}
	if tg, ok := d.pool.injected(seg.Tier); ok {
		seg.Injected = emulationProto(tg)
	}
	if t := d.pool.leaseExpiry(&r); !t.IsZero() {
		seg.LeaseExpiresUnixMs = t.UnixMilli()
	}
	if r.Home == "" && dp != nil {
		seg.Sharers = uint32(dp.coh.sharersOf(r.ID))
	}
	return seg
}
