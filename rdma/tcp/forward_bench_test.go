package tcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
)

// BenchmarkForwardLatency: what forwarding costs a client's writes. It
// alternates rounds of 4 KiB WRITEs to a segment that forwards nothing,
// to a primary that copies to one backup (ForwardCopy), and to the data
// home of a 4+2 erasure-coded stripe that XORs parity deltas into two
// parity homes (ForwardParity), at 1 and at 16 in flight on one
// connection, and reports each one's p50 latency over all rounds and its
// ratio to the unforwarded segment's, and the median over the rounds of
// its write rate's ratio to the unforwarded segment's in the same round
// (a burst of other load on a shared host hits one round, not the whole
// comparison). Every data plane runs in this process, on loopback.
//
//	go test -run '^$' -bench ForwardLatency -benchtime 15000x ./rdma/tcp
func BenchmarkForwardLatency(b *testing.B) {
	for _, depth := range []int{1, 16} {
		b.Run(fmt.Sprintf("inflight=%d", depth), func(b *testing.B) { forwardLatency(b, depth) })
	}
}

// forwardLatency runs BenchmarkForwardLatency at depth writes in flight.
func forwardLatency(b *testing.B, depth int) {
	const size = 1 << 20
	cfg := ServerConfig{}
	plain := homesWith(b, cfg, 1, 1, size)[0]
	copies := homesWith(b, cfg, 2, 1, size)
	if err := copies[0].srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: targets(b, copies[1:], WithBusyPoll(DefaultBusyPoll))}); err != nil {
		b.Fatal(err)
	}
	stripe := homesWith(b, cfg, 3, 1, size)
	if err := stripe[0].srv.Forward(1, &Forwarding{Mode: ForwardParity, Shard: 0, DataShards: 4, ParityShards: 2, Targets: targets(b, stripe[1:], WithBusyPoll(DefaultBusyPoll))}); err != nil {
		b.Fatal(err)
	}
	type setup struct {
		name string
		h    *home
		cl   *Client
		lat  []time.Duration
		took time.Duration // of the last round
		rate []float64     // per round, ÷ the unforwarded segment's
	}
	setups := []*setup{{name: "none", h: plain}, {name: "copy", h: copies[0]}, {name: "parity4+2", h: stripe[0]}}
	for _, s := range setups {
		s.cl = dial(b, s.h.srv.addr, WithConns(1))
	}
	ctx := context.Background()
	buf := make([]byte, 4096)
	rand.Read(buf)
	run := func(s *setup, n int, record bool) {
		lats := make([][]time.Duration, depth)
		var wg sync.WaitGroup
		start := time.Now()
		for g := range depth {
			wg.Go(func() {
				for i := range n / depth {
					t0 := time.Now()
					if err := s.cl.Write(ctx, s.h.r, int64((g*n/depth+i)%(size/4096))*4096, buf); err != nil {
						b.Error(err)
						return
					}
					lats[g] = append(lats[g], time.Since(t0))
				}
			})
		}
		wg.Wait()
		if record {
			s.took = time.Since(start)
			for _, l := range lats {
				s.lat = append(s.lat, l...)
			}
		}
	}
	for _, s := range setups {
		run(s, 512, false) // warm up
	}
	b.ResetTimer()
	for _, n := range rounds(b.N/len(setups), 512) {
		for _, s := range setups {
			run(s, max(n, depth), true)
		}
		for _, s := range setups {
			s.rate = append(s.rate, float64(setups[0].took)/float64(s.took))
		}
	}
	b.StopTimer()
	base := p50(setups[0].lat)
	for _, s := range setups {
		m := p50(s.lat)
		slices.Sort(s.rate)
		rate := s.rate[len(s.rate)/2]
		b.ReportMetric(float64(m)/float64(base), "p50/none("+s.name+")")
		b.ReportMetric(rate, "rate/none("+s.name+")")
		report(b, "4 KiB WRITE at %d in flight, forwarding %s: p50 %v (%.2f× none), write rate %.2f× none (median of %d rounds), n=%d", depth, s.name, m, float64(m)/float64(base), rate, len(s.rate), len(s.lat))
	}
}

// BenchmarkReedSolomonEncode: the parity work of one core, the encoder
// erasure-coded segments use: a full 4+2 stripe of 4 KiB shards (Encode),
// and the delta update a data home does per 4 KiB write (EncodeIdx of one
// shard into both parity shards). b.SetBytes counts the data bytes, so
// MB/s is data encoded per second.
//
//	go test -run '^$' -bench ReedSolomonEncode -cpu 1 ./rdma/tcp
func BenchmarkReedSolomonEncode(b *testing.B) {
	const k, m, shard = 4, 2, 4096
	enc, err := reedsolomon.New(k, m)
	if err != nil {
		b.Fatal(err)
	}
	shards := make([][]byte, k+m)
	for i := range shards {
		shards[i] = make([]byte, shard)
		if i < k {
			rand.Read(shards[i])
		}
	}
	b.Run(fmt.Sprintf("Encode/%d+%d/%dB", k, m, shard), func(b *testing.B) {
		b.SetBytes(k * shard)
		for b.Loop() {
			if err := enc.Encode(shards); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("EncodeIdx/%d+%d/%dB", k, m, shard), func(b *testing.B) {
		b.SetBytes(shard)
		for b.Loop() {
			for _, p := range shards[k:] {
				clear(p)
			}
			if err := enc.EncodeIdx(shards[0], 0, shards[k:]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
