package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/testcluster"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

func init() {
	clientRoles["fence-writer"] = roleFenceWriter
	clientRoles["fence-owner"] = roleFenceOwner
}

// fenceSize is the segment both fencing roles allocate: the same size, so
// that the new owner's segment takes the old one's extent.
const fenceSize = 1 << 20

// allocFenced dials the target and allocates a fenceSize rdma segment.
func allocFenced(ctx context.Context, opts ...alloc.DialOption) (*alloc.Client, *alloc.Segment, error) {
	c, err := dialTarget(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	seg, err := c.Alloc(ctx, fenceSize, alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, seg, nil
}

// roleFenceWriter allocates an unnamed rdma segment, prints "ready
// <node>", then, every 50 ms, forever, writes 0xAA over all of it twice:
// through the Segment, and straight to the home's data plane with the
// region (id, key, epoch) the segment was granted, as a client that has not
// heard from its pool would. It prints one line per write: "ok",
// "expired" (ErrLeaseExpired), "lost" (ErrSegmentLost: the client's pool
// has said so) or "err <error>", prefixed with "raw " for the direct write.
func roleFenceWriter(ctx context.Context) error {
	c, seg, err := allocFenced(ctx, alloc.WithOpTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	// A session under the client's own id sees the segment's key and the
	// data-plane credential of its home (which the home renews when the
	// pool's session with it comes back).
	sess, err := session.Dial(ctx, "unix", os.Getenv(targetEnv), session.Options{ClientID: c.ID()})
	if err != nil {
		return err
	}
	defer sess.Close()
	stat := func(ctx context.Context) (*poolv1.Segment, error) {
		sctx, _, err := sess.Call(ctx)
		if err != nil {
			return nil, err
		}
		return sess.API().Stat(sctx, &poolv1.StatRequest{Id: seg.ID()})
	}
	info, err := stat(ctx)
	if err != nil {
		return err
	}
	region := rdma.Region{Segment: info.HomeId, Key: rdma.Key(info.Key), Epoch: info.Epoch}
	fmt.Println("ready", seg.Node())
	b := bytes.Repeat([]byte{0xAA}, fenceSize)
	say := func(prefix string, err error) {
		switch {
		case err == nil:
			fmt.Println(prefix + "ok")
		case errors.Is(err, alloc.ErrLeaseExpired), errors.Is(err, rdma.ErrLeaseExpired):
			fmt.Println(prefix + "expired")
		case errors.Is(err, alloc.ErrSegmentLost):
			fmt.Println(prefix + "lost")
		default:
			fmt.Println(prefix+"err", err)
		}
	}
	var rawTLS []tcp.Option
	if info.DataTls { // the home serves TLS: the direct write verifies it as the library does
		tc, err := certs.Verifier(info.DataTlsCa, info.DataServerName)
		if err != nil {
			return err
		}
		rawTLS = []tcp.Option{tcp.WithTLS(tc)}
	}
	var raw *tcp.Client
	for {
		_, err := seg.WriteAt(b, 0)
		say("", err)
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if raw == nil {
			if fresh, err := stat(wctx); err == nil && len(fresh.DataCredential) > 0 {
				info.DataCredential = fresh.DataCredential
			}
			raw, err = tcp.Dial(wctx, info.DataAddr, append([]tcp.Option{tcp.WithCredential(info.DataCredential)}, rawTLS...)...)
		}
		if raw != nil {
			err = raw.Write(wctx, region, 0, b)
			if err != nil && !errors.Is(err, rdma.ErrLeaseExpired) {
				raw.Close()
				raw = nil
			}
		}
		cancel()
		say("raw ", err)
		time.Sleep(50 * time.Millisecond)
	}
}

// roleFenceOwner allocates an rdma segment, fills it with 0x55, prints
// "ready <node>", waits for the gate file, then reads it back and prints
// "intact" or "clobbered".
func roleFenceOwner(ctx context.Context) error {
	c, seg, err := allocFenced(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	want := bytes.Repeat([]byte{0x55}, fenceSize)
	if _, err := seg.WriteAt(want, 0); err != nil {
		return err
	}
	fmt.Println("ready", seg.Node())
	for gate := os.Getenv(gateEnv); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(gate); err == nil {
			break
		}
	}
	got := make([]byte, fenceSize)
	if _, err := seg.ReadAt(got, 0); err != nil {
		return err
	}
	if bytes.Equal(got, want) {
		fmt.Println("intact")
	} else {
		fmt.Println("clobbered")
	}
	return nil
}

// TestFencingUnderPartition: a client on host a writes its rdma segment on
// home h; a's link goes down past h's lease for a's poold (the peer
// lease), h reclaims the segment and gives its memory to a client on the
// third host; the link comes back. Every write the old client retries from then on is refused — with
// ErrLeaseExpired by the home's data plane — and the new owner's bytes are
// intact.
func TestFencingUnderPartition(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	nodes := startPools(t, c)
	a := nodes[0]
	waitAllAlive(t, nodes)

	old := startClient(t, a.host, "fence-writer", a.sock)
	h := nodeNamed(t, nodes, readyNode(t, old))
	require.NotEqual(t, a, h, "an rdma segment goes to a peer")
	waitLine(t, old, 0, settle, exactly("ok"))
	var x *poolNode
	for _, n := range nodes {
		if n != a && n != h {
			x = n
		}
	}

	a.host.LinkDown(t)
	reclaimed := h.waitExportFree(t, exportSize)
	t.Logf("link of %s down: %s reclaimed the segment after %v (peer lease TTL %v)", a.name, h.name, reclaimed, peerLeaseTTL)
	// From here on no write of the old client may succeed: the segment is gone.
	fenced := len(old.Output())
	// x must not place on a, which it cannot reach.
	x.waitStates(t, map[string]string{a.name: "!alive"})
	gate := shortDir(t) + "/go"
	owner := startClient(t, x.host, "fence-owner", x.sock, gateEnv+"="+gate)
	require.Equal(t, h.name, readyNode(t, owner), "the new segment is on the same home (the only peer %s sees alive)", x.name)
	_, free, err := h.exportFree(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(exportSize-fenceSize), free)

	a.host.LinkUp(t)
	up := a.waitStates(t, map[string]string{h.name: "alive"})
	t.Logf("link of %s up: it saw %s alive again after %v", a.name, h.name, up)
	// The old client retries: straight to the home, refused by its fence;
	// through the library, refused too (its pool reports the segment lost
	// once it hears from the home again, or the home's fence answers).
	off := fenced
	for range 5 {
		_, off, _ = waitLine(t, old, off, settle, exactly("raw expired"))
	}
	// The writes under way when the segment was reclaimed may have been
	// applied before it, their answers held up by the partition (the
	// home's TCP retransmits them once the link is back, up to 12.6 s
	// after the loss): the check starts after the first "raw" line, which
	// ends the iteration that was under way.
	after := strings.Split(old.Output()[fenced:], "\n")
	after = after[slices.IndexFunc(after, func(l string) bool { return strings.HasPrefix(l, "raw ") })+1:]
	for _, l := range after {
		require.NotContains(t, []string{"ok", "raw ok"}, l, "a write of the old client that began after its segment was reclaimed succeeded")
	}
	require.NoError(t, os.WriteFile(gate, nil, 0o600))
	line, _, _ := waitLine(t, owner, 0, settle, func(l string) bool { return l == "intact" || l == "clobbered" || strings.HasPrefix(l, "error: ") })
	require.Equal(t, "intact", line, "the new owner's bytes after the old client's retries")
}
