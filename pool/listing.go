package pool

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// Limits on one List response.
const (
	// maxPageSize is the most segments one List response holds.
	maxPageSize = 5000
	// maxPageBytes bounds one List response's encoded segments, well
	// under gRPC's default 4 MiB message limit.
	maxPageBytes = 3 << 20
)

// pageToken is where a listing continues: after segment id on node. Its
// text form is "NODE/ID"; the zero token starts at the beginning.
type pageToken struct {
	node string
	id   uint64
}

func (t pageToken) String() string { return t.node + "/" + strconv.FormatUint(t.id, 10) }

// parsePageToken reads a ListRequest's page_token ("" is the zero token).
func parsePageToken(s string) (pageToken, error) {
	if s == "" {
		return pageToken{}, nil
	}
	i := strings.LastIndexByte(s, '/')
	if i >= 0 {
		if id, err := strconv.ParseUint(s[i+1:], 10, 64); err == nil {
			return pageToken{node: s[:i], id: id}, nil
		}
	}
	return pageToken{}, fmt.Errorf("%w: page_token %q is not one a List response handed out; start again without one", errs.ErrInvalid, s)
}

// pageLimit is the number of segments a request's page_size asks for; 0
// means no count limit (the byte limit still holds).
func pageLimit(n uint32) int { return int(min(n, maxPageSize)) }

// page gathers a List response under the byte limit.
type page struct {
	resp  *poolv1.ListResponse
	bytes int
	limit int
}

// add appends seg unless the page is full (by count or bytes); an empty
// page takes a segment whatever its size.
func (p *page) add(seg *poolv1.Segment) bool {
	n := proto.Size(seg) + 4 // field tag and length
	if (p.limit > 0 && len(p.resp.Segments) >= p.limit) || (len(p.resp.Segments) > 0 && p.bytes+n > maxPageBytes) {
		return false
	}
	p.resp.Segments = append(p.resp.Segments, seg)
	p.bytes += n
	return true
}

func (p *page) full() bool {
	return (p.limit > 0 && len(p.resp.Segments) >= p.limit) || p.bytes >= maxPageBytes
}

// last is the id of the page's last segment.
func (p *page) last() uint64 { return p.resp.Segments[len(p.resp.Segments)-1].Id }

func (s *service) List(ctx context.Context, req *poolv1.ListRequest) (*poolv1.ListResponse, error) {
	c := s.viewer(ctx)
	tok, err := parsePageToken(req.PageToken)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	pg := &page{resp: &poolv1.ListResponse{}, limit: pageLimit(req.PageSize)}
	everyNode := req.All && s.d.pool.gossip() != nil
	if everyNode {
		if c.client != nil {
			return nil, errs.ToStatus(fmt.Errorf("%w: listing every node's segments is for administrators (poold --admin), not %s; list this node's", errs.ErrAccessDenied, c.ident))
		}
		if err := s.listEveryNode(ctx, c, pg, tok); err != nil {
			return nil, errs.ToStatus(err)
		}
	} else {
		if tok.node != "" && tok.node != s.d.cfg.Node {
			return nil, errs.ToStatus(fmt.Errorf("%w: page_token %q is from node %s's listing, not this node's (%s); start again without one", errs.ErrInvalid, req.PageToken, tok.node, s.d.cfg.Node))
		}
		if next, more := s.listOwn(ctx, c, pg, tok.id); more {
			pg.resp.NextPageToken = pageToken{node: s.d.cfg.Node, id: next}.String()
		}
	}
	if !strings.HasPrefix(c.id(), peerClientPrefix) {
		// Sharer counts are for people (memctl); a daemon asking (an
		// owner's reconciliation, or another node's listing) needs only
		// this node's records, whose own counts are already set. Filling
		// them for a peer made every such List ask every node in turn, and
		// those asks fill theirs again: at 200 simulated hosts the fill
		// phase spent its CPU on List storms after each new peer session.
		s.fillSharers(ctx, pg.resp.Segments, everyNode)
	}
	return pg.resp, nil
}

// listOwn adds this node's segments with ids above after that the caller
// may see to pg until it is full: the id to continue after, and whether
// some were left out.
func (s *service) listOwn(ctx context.Context, c caller, pg *page, after uint64) (next uint64, more bool) {
	limit := 0
	if pg.limit > 0 {
		limit = pg.limit - len(pg.resp.Segments)
	}
	recs, more := s.d.pool.listPage(after, limit)
	next = after
	for _, r := range recs {
		if s.d.visible(c, &r) {
			if !pg.add(s.d.forCaller(ctx, c, r)) {
				return next, true
			}
		}
		next = r.ID
	}
	return next, more
}

// listEveryNode fills pg with every alive node's segments from tok on, by
// node name and then id, asking each peer for pages of its own, and sets
// the token of the next page when pg fills before the last node's last
// segment.
func (s *service) listEveryNode(ctx context.Context, c caller, pg *page, tok pageToken) error {
	nodes := []cluster.Member{{Name: s.d.cfg.Node}}
	for _, m := range s.d.pool.gossip().Members() {
		if m.Name != s.d.cfg.Node && m.State == cluster.StateAlive && m.MetaErr == nil && m.Meta.GRPCAddr != "" {
			nodes = append(nodes, m)
		}
	}
	slices.SortFunc(nodes, func(a, b cluster.Member) int { return strings.Compare(a.Name, b.Name) })
	for _, m := range nodes {
		if m.Name < tok.node {
			continue
		}
		after := uint64(0)
		if m.Name == tok.node {
			after = tok.id
		}
		var more bool
		if m.Name == s.d.cfg.Node {
			after, more = s.listOwn(ctx, c, pg, after)
		} else {
			added, peerMore, err := s.listPeer(ctx, m, pg, after)
			if err != nil {
				return err
			}
			if more = peerMore; added > 0 {
				after = pg.last()
			}
		}
		if more || pg.full() {
			// Segment ids are per node: the token names the node whose
			// section the page ends in.
			pg.resp.NextPageToken = pageToken{node: m.Name, id: after}.String()
			return nil
		}
	}
	return nil
}

// listPeer adds node m's own segments with ids above after to pg, page by
// page, until pg is full or m has no more: how many it added, and whether
// m has segments left out.
func (s *service) listPeer(ctx context.Context, m cluster.Member, pg *page, after uint64) (added int, more bool, err error) {
	pc, err := s.d.pool.peerConns().get(ctx, m.Name, m.Meta.GRPCAddr)
	if err != nil {
		return 0, false, err
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return 0, false, err
	}
	next := ""
	if after > 0 {
		next = pageToken{node: m.Name, id: after}.String()
	}
	for {
		req := &poolv1.ListRequest{PageSize: poolv1.ListPageSize, PageToken: next}
		if pg.limit > 0 {
			req.PageSize = uint32(pg.limit - len(pg.resp.Segments))
		}
		resp, err := pc.API().List(cctx, req)
		if err != nil {
			return added, false, fmt.Errorf("list on %s: %w", m.Name, errs.FromStatus(err))
		}
		for _, seg := range resp.Segments {
			if !pg.add(seg) {
				return added, true, nil
			}
			added++
		}
		if resp.NextPageToken == "" || resp.NextPageToken == next {
			return added, false, nil
		}
		if pg.full() {
			return added, true, nil
		}
		next = resp.NextPageToken
	}
}

// listNodes gathers the segments of the alive peers named in nodes, page
// by page.
func (s *service) listNodes(ctx context.Context, nodes map[string]bool) ([]*poolv1.Segment, error) {
	var out []*poolv1.Segment
	for _, m := range s.d.pool.gossip().Members() {
		if !nodes[m.Name] || m.Name == s.d.cfg.Node || m.State != cluster.StateAlive || m.MetaErr != nil || m.Meta.GRPCAddr == "" {
			continue
		}
		pc, err := s.d.pool.peerConns().get(ctx, m.Name, m.Meta.GRPCAddr)
		if err != nil {
			return nil, err
		}
		cctx, _, err := pc.Call(ctx)
		if err != nil {
			return nil, err
		}
		segs, err := poolv1.ListAll(cctx, pc.API(), &poolv1.ListRequest{}, 0)
		if err != nil {
			return nil, fmt.Errorf("list on %s: %w", m.Name, errs.FromStatus(err))
		}
		out = append(out, segs...)
	}
	return out, nil
}
