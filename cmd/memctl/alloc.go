package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
)

func newAllocCmd(g *globals) *cobra.Command {
	var (
		sz               sizeFlag
		tierFlag         string
		name             string
		allow, allowFree []string
		maxLatency       time.Duration
		minBandwidth     rateFlag
		redundancyFlag   string
	)
	cmd := &cobra.Command{
		Use:   "alloc --size SIZE [--tier cxl] [--redundancy replicas=2|ec=4+2] [--max-latency 2us] [--min-bandwidth 1GB/s] [--name NAME [--allow IDENTITY,...] [--allow-free IDENTITY,...]]",
		Short: "Allocate a segment that stays until 'memctl free'",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := tier.Parse(tierFlag)
			if err != nil {
				return fmt.Errorf("--tier: %w", err)
			}
			if cmd.Flags().Changed("max-latency") && maxLatency <= 0 {
				return fmt.Errorf("--max-latency %s: %w: a latency budget must be positive, e.g. 2us; leave the flag out for none", maxLatency, errs.ErrInvalid)
			}
			if cmd.Flags().Changed("min-bandwidth") && minBandwidth <= 0 {
				return fmt.Errorf("--min-bandwidth %d B/s: %w: a bandwidth budget must be positive, e.g. 1GB/s; leave the flag out for none", int64(minBandwidth), errs.ErrInvalid)
			}
			req := &poolv1.AllocRequest{Size: int64(sz.Size), Tier: t, Name: name, Persist: true, Allow: allow, AllowFree: allowFree,
				MaxReadLatencyNs: maxLatency.Nanoseconds(), MinReadBandwidthBps: int64(minBandwidth)}
			if cmd.Flags().Changed("redundancy") {
				s, err := redundancy.Parse(redundancyFlag)
				if err != nil {
					return fmt.Errorf("--redundancy: %w", err)
				}
				req.Redundancy = &poolv1.Redundancy{Replicas: uint32(s.Replicas), DataShards: uint32(s.Data), ParityShards: uint32(s.Parity), AllowFallback: s.Fallback}
			}
			var seg *poolv1.Segment
			err = g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				seg, err = c.Alloc(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(allocJSON{segmentView(seg), placementView(seg.Placement)})
			}
			fmt.Fprintf(g.out, "allocated segment %d: %s on %s (%s, %s, device %s, node %s)\n", seg.Id, human(seg.Size),
				tier.Name(seg.Tier), seg.Kind, reality(seg.Emulated), seg.Device, seg.Node)
			if p := seg.Placement; p != nil {
				fmt.Fprintf(g.out, "placed by: %s\n", p.Reason)
			}
			if v := segmentView(seg); v.Redundancy != "" {
				fmt.Fprintf(g.out, "redundancy: %s; homes: %s\n", redundancyCell(v), homesLine(v))
			}
			return nil
		},
	}
	cmd.Flags().Var(&sz, "size", "segment size, e.g. 64MiB (required)")
	cmd.Flags().StringVar(&tierFlag, "tier", "any", "tier: local, cxl, rdma or any")
	cmd.Flags().StringVar(&redundancyFlag, "redundancy", "", "copies on distinct hosts (rdma tier only): none, replicas=N or ec=K+M, optionally followed by ,or-fewer to take fewer when too few hosts have room (default: the daemon's --default-redundancy)")
	cmd.Flags().DurationVar(&maxLatency, "max-latency", 0, "place only on a tier whose read latency p50 (as 'memctl tiers' shows it) is at most this, the cheapest first: rdma, cxl, local; e.g. 2us")
	cmd.Flags().Var(&minBandwidth, "min-bandwidth", "place only on a tier whose read bandwidth is at least this many bytes per second, e.g. 1GB/s")
	cmd.Flags().StringVar(&name, "name", "", "unique name clients of the identities allowed can attach")
	cmd.Flags().StringSliceVar(&allow, "allow", nil, "identities besides memctl's own that may attach the name: uid:N, gid:N (primary gid) or cn:NAME (client certificate), comma-separated")
	cmd.Flags().StringSliceVar(&allowFree, "allow-free", nil, "identities that may attach the name and free it")
	cmd.MarkFlagRequired("size")
	return cmd
}

// sizeFlag is a byte-size flag with no default: its help shows none
// (pflag would print "(default 0B)" beside "(required)").
type sizeFlag struct{ size.Size }

func (f *sizeFlag) String() string {
	if f.Size == 0 {
		return ""
	}
	return f.Size.String()
}

// rateFlag is a flag of bytes per second: a size with an optional "/s",
// e.g. 1GB/s, 800MiB/s, 2G.
type rateFlag int64

func (f *rateFlag) String() string {
	if *f == 0 {
		return ""
	}
	return size.Size(*f).String() + "/s"
}

func (f *rateFlag) Set(v string) error {
	n, err := size.Parse(strings.TrimSuffix(strings.TrimSpace(v), "/s"))
	if err != nil {
		return fmt.Errorf("%w: bytes per second such as 1GB/s or 800MiB/s", err)
	}
	*f = rateFlag(n)
	return nil
}

func (f *rateFlag) Type() string { return "bytes/s" }

// allocJSON is an allocated segment as -o json prints it, with why it is
// on its tier.
type allocJSON struct {
	segmentJSON
	Placement *placementJSON `json:"placement,omitempty"`
}

type placementJSON struct {
	ReadLatency         *latencyJSON `json:"read_latency,omitempty"`
	ReadBandwidth       int64        `json:"read_bandwidth_bps,omitempty"`
	ReadBandwidthSource string       `json:"read_bandwidth_source,omitempty"`
	MaxReadLatencyNs    int64        `json:"max_read_latency_ns,omitempty"`
	MinReadBandwidth    int64        `json:"min_read_bandwidth_bps,omitempty"`
	Reason              string       `json:"reason"`
}

func placementView(p *poolv1.Placement) *placementJSON {
	if p == nil {
		return nil
	}
	return &placementJSON{
		ReadLatency: latency(p.ReadLatency), ReadBandwidth: p.ReadBandwidthBps, ReadBandwidthSource: p.ReadBandwidthSource,
		MaxReadLatencyNs: p.MaxReadLatencyNs, MinReadBandwidth: p.MinReadBandwidthBps, Reason: p.Reason,
	}
}
