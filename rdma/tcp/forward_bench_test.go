package tcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
)

// BenchmarkForwardLatency: what forwarding costs a client's write. It
// alternates rounds of 4 KiB WRITEs, one in flight, to a segment that
// forwards nothing, to a primary that copies to one backup (ForwardCopy),
// and to the data home of a 4+2 erasure-coded stripe that XORs parity
// deltas into two parity homes (ForwardParity), and reports each one's
// p50 over all rounds and the ratios to the unforwarded p50. Every data
// plane runs in this process, on loopback.
//
//	go test -run '^$' -bench ForwardLatency -benchtime 20000x ./rdma/tcp
func BenchmarkForwardLatency(b *testing.B) {
	for _, poll := range []bool{true, false} {
		b.Run(fmt.Sprintf("busypoll=%v", poll), func(b *testing.B) { forwardLatency(b, poll) })
	}
}

// forwardLatency runs BenchmarkForwardLatency with busy polling on every
// data plane and client, or off.
func forwardLatency(b *testing.B, poll bool) {
	const size = 1 << 20
	cfg, opt := ServerConfig{}, WithBusyPoll(DefaultBusyPoll)
	if !poll {
		cfg.BusyPoll, opt = -1, WithBusyPoll(-1)
	}
	homes := func(n int) []*home {
		hs := make([]*home, n)
		for i := range hs {
			srv := startServer(b, cfg)
			mem, r := srv.export(b, 1, size)
			hs[i] = &home{srv: srv, mem: mem, r: r}
		}
		return hs
	}
	plain := homes(1)[0]
	copies := homes(2)
	if err := copies[0].srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: targets(b, copies[1:], opt)}); err != nil {
		b.Fatal(err)
	}
	stripe := homes(3)
	if err := stripe[0].srv.Forward(1, &Forwarding{Mode: ForwardParity, Shard: 0, DataShards: 4, ParityShards: 2, Targets: targets(b, stripe[1:], opt)}); err != nil {
		b.Fatal(err)
	}
	type setup struct {
		name string
		h    *home
		cl   *Client
		lat  []time.Duration
	}
	setups := []*setup{{name: "none", h: plain}, {name: "copy", h: copies[0]}, {name: "parity4+2", h: stripe[0]}}
	for _, s := range setups {
		s.cl = dial(b, s.h.srv.addr, WithConns(1), opt)
	}
	ctx := context.Background()
	buf := make([]byte, 4096)
	rand.Read(buf)
	run := func(s *setup, n int, record bool) {
		for i := range n {
			start := time.Now()
			if err := s.cl.Write(ctx, s.h.r, int64(i%(size/4096))*4096, buf); err != nil {
				b.Fatal(err)
			}
			if record {
				s.lat = append(s.lat, time.Since(start))
			}
		}
	}
	for _, s := range setups {
		run(s, 500, false) // warm up
	}
	b.ResetTimer()
	for _, n := range rounds(b.N/len(setups), 500) {
		for _, s := range setups {
			run(s, n, true)
		}
	}
	b.StopTimer()
	base := p50(setups[0].lat)
	for _, s := range setups {
		m := p50(s.lat)
		b.ReportMetric(float64(m)/float64(base), "p50/none("+s.name+")")
		report(b, "4 KiB WRITE p50, forwarding %s: %v (%.2f× none), n=%d", s.name, m, float64(m)/float64(base), len(s.lat))
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
