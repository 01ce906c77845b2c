package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/dialer"
)

// verbsCheck asks poold (the client's local daemon) for an rdma-tier
// segment, which it places on a peer, then reaches the peer's memory with
// the transport the picker chooses: it must be verbs. It checks READ,
// WRITE, CAS and FETCH_ADD, measures 64 B READ latency and 1 MiB READ and
// WRITE bandwidth, and checks that freeing the segment revokes its key.
func verbsCheck(args []string) bool {
	fs := flag.NewFlagSet("verbs", flag.ExitOnError)
	socket := fs.String("socket", "", "poold socket of the client's daemon")
	want := fs.String("want", "verbs", "transport the picker must choose")
	iters := fs.Int("iters", 2000, "64 B READs to time")
	bwMiB := fs.Int("bw-mib", 64, "MiB to move for each bandwidth figure")
	depth := fs.Int("depth", 8, "1 MiB operations in flight for the bandwidth figures")
	checks := fs.Bool("checks", true, "run the functional checks")
	measure := fs.String("measure", "all", "what to measure: lat, bw, all or none")
	fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	sc, err := session.Dial(ctx, "unix", *socket, session.Options{ClientID: fmt.Sprintf("labcheck-%d-%d", os.Getpid(), time.Now().UnixNano()), ClientName: "labcheck"})
	if err != nil {
		return result("verbs-alloc", false, "session with %s: %v", *socket, err)
	}
	defer sc.Close()
	cctx, _, err := sc.Call(ctx)
	if err != nil {
		return result("verbs-alloc", false, "session with %s: %v", *socket, err)
	}
	api := sc.API()
	const segSize = 16 << 20
	seg, err := api.Alloc(cctx, &poolv1.AllocRequest{Size: segSize, Tier: poolv1.Tier_TIER_RDMA, Name: fmt.Sprintf("lab-verbs-%d", os.Getpid()), Persist: true})
	if err != nil {
		return result("verbs-alloc", false, "alloc 16MiB on the rdma tier: %v", errs.FromStatus(err))
	}
	freed := false
	defer func() {
		if !freed {
			api.Free(cctx, &poolv1.FreeRequest{Id: seg.Id})
		}
	}()
	var key rdma.Key
	copy(key[:], seg.Key)
	region := rdma.Region{Segment: seg.HomeId, Key: key, Epoch: seg.Epoch}
	ok := !*checks || result("verbs-alloc", seg.Node != "" && seg.DataAddr != "", "segment %d on peer %s (home id %d), data plane %s", seg.Id, seg.Node, seg.HomeId, seg.DataAddr)

	conn, name, err := dialer.Dial(ctx, seg.DataAddr, seg.DataCredential)
	if err != nil {
		return result("pick-"+*want, false, "dial %s: %v", seg.DataAddr, err)
	}
	defer conn.Close()
	pref, why := dialer.Preferred()
	ok = result("pick-"+*want, name == *want, "picker chose %s (want %s); preferred here: %s: %s", name, *want, pref, why) && ok

	if *checks {
		ok = functional(ctx, conn, region, segSize) && ok
	}
	if *measure == "lat" || *measure == "all" {
		ok = readLatency(ctx, conn, region, *iters) && ok
	}
	if *measure == "bw" || *measure == "all" {
		for _, kind := range []rdma.OpKind{rdma.OpRead, rdma.OpWrite} {
			ok = bandwidthCheck(ctx, conn, region, kind, *bwMiB, *depth) && ok
		}
	}
	if !*checks {
		return ok
	}

	// Free revokes the key: the peer deregisters the memory region.
	if _, err := api.Free(cctx, &poolv1.FreeRequest{Id: seg.Id}); err != nil {
		return result("verbs-revoke", false, "free segment %d: %v", seg.Id, errs.FromStatus(err))
	}
	freed = true
	buf := make([]byte, 64)
	var rerr error
	for range 50 { // the free reaches the peer asynchronously
		c2, _, err := dialer.Dial(ctx, seg.DataAddr, seg.DataCredential)
		if err != nil {
			rerr = err
			break
		}
		rerr = c2.Read(ctx, region, 0, buf)
		c2.Close()
		if rerr != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A freed segment is fenced: its old key gets ErrLeaseExpired (or
	// ErrAccessDenied once the fence is forgotten); either way no access.
	revoked := errors.Is(rerr, rdma.ErrAccessDenied) || errors.Is(rerr, rdma.ErrLeaseExpired)
	return result("verbs-revoke", revoked, "READ with the key after free: %v", rerr) && ok
}

// functional checks READ, WRITE, CAS, FETCH_ADD and the refusals.
func functional(ctx context.Context, conn rdma.Conn, region rdma.Region, segSize int64) bool {
	// WRITE a pattern, READ it back (both spanning several work requests).
	data := make([]byte, 3<<20+123)
	for i := range data {
		data[i] = pattern("verbs", i)
	}
	got := make([]byte, len(data))
	err := conn.Write(ctx, region, 4096, data)
	if err == nil {
		err = conn.Read(ctx, region, 4096, got)
	}
	ok := result("verbs-write-read", err == nil && bytes.Equal(got, data), "%d bytes at offset 4096: err=%v equal=%v", len(data), err, bytes.Equal(got, data))

	// Atomics on a word of the peer's memory.
	prev, swapped, err1 := conn.CompareAndSwap64(ctx, region, 0, 0, 42)
	prev2, swapped2, err2 := conn.CompareAndSwap64(ctx, region, 0, 0, 7)
	prev3, err3 := conn.FetchAdd64(ctx, region, 0, 8)
	var word [8]byte
	err4 := conn.Read(ctx, region, 0, word[:])
	atomOK := errors.Join(err1, err2, err3, err4) == nil && prev == 0 && swapped && prev2 == 42 && !swapped2 && prev3 == 42 && word[0] == 50
	ok = result("verbs-atomics", atomOK, "CAS 0->42 prev=%d swapped=%v; CAS 0->7 prev=%d swapped=%v; FADD +8 prev=%d; word now %d; err=%v",
		prev, swapped, prev2, swapped2, prev3, word[0], errors.Join(err1, err2, err3, err4)) && ok

	// Out-of-range and unaligned requests are refused before posting.
	errR := conn.Read(ctx, region, segSize-8, make([]byte, 16))
	_, errU := conn.FetchAdd64(ctx, region, 4, 1)
	ok = result("verbs-bounds", errors.Is(errR, rdma.ErrOutOfRange) && errors.Is(errU, rdma.ErrUnaligned), "read past the end: %v; unaligned FADD: %v", errR, errU) && ok

	return concurrent(ctx, conn, region) && ok
}

// concurrent runs lone operations from several goroutines on one
// connection at once (each caller in turn polls for the others), with one
// goroutine moving 320 KiB transfers (several work requests each) beside
// them: every read must return what its goroutine wrote, and the shared
// counter must count every FETCH_ADD.
func concurrent(ctx context.Context, conn rdma.Conn, region rdma.Region) bool {
	const (
		workers = 4
		rounds  = 200
		counter = 12 << 20 // a word no other check uses
		area    = 13 << 20 // each worker's 64 KiB from here on
	)
	if err := conn.Write(ctx, region, counter, make([]byte, 8)); err != nil {
		return result("verbs-concurrent", false, "clear the counter: %v", err)
	}
	errc := make(chan error, workers+1)
	for w := range workers {
		go func() {
			off := int64(area + w<<16)
			buf, got := make([]byte, 4096), make([]byte, 4096)
			for i := range rounds {
				for j := range buf {
					buf[j] = byte(w*31 + i + j)
				}
				if err := conn.Write(ctx, region, off, buf); err != nil {
					errc <- fmt.Errorf("worker %d write %d: %w", w, i, err)
					return
				}
				if _, err := conn.FetchAdd64(ctx, region, counter, 1); err != nil {
					errc <- fmt.Errorf("worker %d fetch-add %d: %w", w, i, err)
					return
				}
				if err := conn.Read(ctx, region, off, got); err != nil {
					errc <- fmt.Errorf("worker %d read %d: %w", w, i, err)
					return
				}
				if !bytes.Equal(got, buf) {
					errc <- fmt.Errorf("worker %d round %d read back other bytes than it wrote", w, i)
					return
				}
			}
			errc <- nil
		}()
	}
	go func() {
		data, got := make([]byte, 320<<10), make([]byte, 320<<10)
		for i := range rounds / 10 {
			for j := range data {
				data[j] = byte(i ^ j)
			}
			err := conn.Write(ctx, region, 8<<20, data)
			if err == nil {
				err = conn.Read(ctx, region, 8<<20, got)
			}
			if err == nil && !bytes.Equal(got, data) {
				err = errors.New("read back other bytes than it wrote")
			}
			if err != nil {
				errc <- fmt.Errorf("320 KiB round %d: %w", i, err)
				return
			}
		}
		errc <- nil
	}()
	var err error
	for range workers + 1 {
		err = errors.Join(err, <-errc)
	}
	var word [8]byte
	if err == nil {
		err = conn.Read(ctx, region, counter, word[:])
	}
	n := binary.LittleEndian.Uint64(word[:])
	return result("verbs-concurrent", err == nil && n == workers*rounds, "%d goroutines x %d write/fetch-add/read of 4 KiB beside 320 KiB transfers: counter %d (want %d), err=%v",
		workers, rounds, n, workers*rounds, err)
}

// readLatency times 64 B READs, one at a time, with the cycle counter
// (calibrated against the monotonic clock, as perftest calibrates it).
func readLatency(ctx context.Context, conn rdma.Conn, region rdma.Region, iters int) bool {
	perNs := cycleRate(200 * time.Millisecond)
	lat := make([]time.Duration, iters)
	buf := make([]byte, 64)
	for i := range lat {
		c0 := cycles()
		// One address, as ib_read_lat reads one buffer.
		if err := conn.Read(ctx, region, 0, buf); err != nil {
			return result("verbs-read-lat", false, "read %d: %v", i, err)
		}
		lat[i] = time.Duration(float64(cycles()-c0) / perNs)
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	fmt.Printf("FARMEM read_lat 64 p50_us=%.2f p99_us=%.2f n=%d cycles_per_us=%.0f\n", us(p50), us(p99), len(lat), perNs*1000)
	return result("verbs-read-lat", true, "64 B READ p50 %.1f us p99 %.1f us over %d", us(p50), us(p99), len(lat))
}

// cycleRate returns how many cycles() ticks pass per nanosecond, measured
// over d against the monotonic clock.
func cycleRate(d time.Duration) float64 {
	t0, c0 := time.Now(), cycles()
	time.Sleep(d)
	c1, t1 := cycles(), time.Now()
	return float64(c1-c0) / float64(t1.Sub(t0))
}

func bandwidthCheck(ctx context.Context, conn rdma.Conn, region rdma.Region, kind rdma.OpKind, total, depth int) bool {
	name := map[rdma.OpKind]string{rdma.OpRead: "read", rdma.OpWrite: "write"}[kind]
	mibps, err := bandwidth(ctx, conn, region, kind, total, depth)
	if err != nil {
		return result("verbs-"+name+"-bw", false, "%v", err)
	}
	fmt.Printf("FARMEM %s_bw 1048576 MiBps=%.1f depth=%d\n", name, mibps, depth)
	return result("verbs-"+name+"-bw", true, "1 MiB %ss, %d in flight: %.1f MiB/s", kind, depth, mibps)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// bandwidth moves total MiB in 1 MiB operations, depth of them in flight:
// two streams, each posting depth/2 at once with one Do (as perftest keeps
// its send queue full), so one stream's reads are on the wire while the
// other copies its data out of the bounce buffer.
func bandwidth(ctx context.Context, conn rdma.Conn, region rdma.Region, kind rdma.OpKind, total, depth int) (float64, error) {
	const streams = 2
	per := max(depth/streams, 1)
	next := make(chan int, total)
	for i := 0; i < total; i += per {
		next <- min(per, total-i)
	}
	close(next)
	errc := make(chan error, streams)
	t := time.Now()
	for s := range streams {
		go func() {
			ops := make([]*rdma.Op, per)
			for i := range ops {
				ops[i] = &rdma.Op{Kind: kind, Region: region, Offset: int64((s*per+i)%8) << 20, Buf: make([]byte, 1<<20)}
			}
			for n := range next {
				if err := conn.Do(ctx, ops[:n]...); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	var err error
	for range streams {
		err = errors.Join(err, <-errc)
	}
	if err != nil {
		return 0, err
	}
	return float64(total) / time.Since(t).Seconds(), nil
}
