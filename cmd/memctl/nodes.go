package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// nodeJSON is a cluster member as -o json prints it.
type nodeJSON struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Self     bool   `json:"self"`
	Zone     string `json:"zone,omitempty"` // its failure domain (poold --zone)
	Draining bool   `json:"draining"`
	// DrainingSince is when the node began to drain (RFC 3339), as the
	// node gossips it; empty when it is not draining.
	DrainingSince string `json:"draining_since,omitempty"`
	// Evacuating: the node moves its segments to other nodes (memctl
	// drain --evacuate), as it gossips it.
	Evacuating bool           `json:"evacuating"`
	GossipAddr string         `json:"gossip_addr,omitempty"`
	GRPCAddr   string         `json:"grpc_addr,omitempty"`
	DataAddr   string         `json:"data_addr,omitempty"`
	Refused    string         `json:"refused,omitempty"` // why this daemon refuses it as a peer
	Tiers      []nodeTierJSON `json:"tiers"`
	// Latency is what the answering daemon measured of the node's data
	// plane; absent for the daemon itself and a node it never probed.
	Latency *peerLatencyJSON `json:"latency,omitempty"`
}

// peerLatencyJSON is one daemon's measurement of a peer's data plane.
type peerLatencyJSON struct {
	Node          string       `json:"node"`
	DataAddr      string       `json:"data_addr,omitempty"`
	ReadLatency   *latencyJSON `json:"read_latency,omitempty"`
	Read4K        *latencyJSON `json:"read_4k_latency,omitempty"`
	ReadBandwidth int64        `json:"read_bandwidth_bps,omitempty"`
	// MeasuredAt is when the figures were taken, or the probe failed.
	MeasuredAt string `json:"measured_at,omitempty"`
	// Unmeasured says why there is no current figure; the read fields are
	// then absent.
	Unmeasured string `json:"unmeasured,omitempty"`
}

// latencyRowJSON is one daemon's row of the latency matrix.
type latencyRowJSON struct {
	From  string            `json:"from"`
	To    []peerLatencyJSON `json:"to"`
	Error string            `json:"error,omitempty"`
}

func peerLatencyView(l *poolv1.PeerLatency) *peerLatencyJSON {
	if l == nil {
		return nil
	}
	v := &peerLatencyJSON{Node: l.Node, DataAddr: l.DataAddr, ReadLatency: latency(l.ReadLatency), Read4K: latency(l.Read_4KLatency),
		ReadBandwidth: l.ReadBandwidthBps, Unmeasured: l.Unmeasured}
	if l.MeasuredUnixMs != 0 {
		v.MeasuredAt = rfc3339(l.MeasuredUnixMs)
	}
	return v
}

// latencyCell is a measurement in a table cell: "98µs p50", "unmeasured",
// or "-" when there is none.
func latencyCell(l *peerLatencyJSON) string {
	switch {
	case l == nil:
		return "-"
	case l.Unmeasured != "":
		return "unmeasured"
	case l.ReadLatency == nil:
		return "-"
	}
	return fmt.Sprintf("%s p50", time.Duration(l.ReadLatency.P50Ns))
}

type nodeTierJSON struct {
	Tier     string `json:"tier"`
	Capacity int64  `json:"capacity"`
	Free     int64  `json:"free"`
}

func newNodesCmd(g *globals) *cobra.Command {
	var matrix bool
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes: state, addresses, free memory per tier, read latency from this node",
		Long: `List the cluster's nodes: state, addresses, free memory per tier, and the
read latency poold measured from this node to each peer's data plane
(64-byte one-sided reads of a probe segment there, p50; taken when the peer
joins, comes back or moves, and every --measure-peers-every). A peer whose
probe failed shows "unmeasured"; -o json says why.

--matrix asks every alive node for its own measurements and prints the
cluster's latency matrix: one row per node measuring, one column per node
measured.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var resp *poolv1.NodesResponse
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				resp, err = c.Nodes(ctx, &poolv1.NodesRequest{Matrix: matrix})
				return err
			})
			if err != nil {
				return err
			}
			if matrix {
				return printMatrix(g, resp)
			}
			out := make([]nodeJSON, len(resp.Nodes))
			for i, n := range resp.Nodes {
				out[i] = nodeJSON{Name: n.Name, State: n.State, Self: n.Self, Zone: n.Zone, Draining: n.Draining, Evacuating: n.Evacuating,
					GossipAddr: n.GossipAddr, GRPCAddr: n.GrpcAddr, DataAddr: n.DataAddr, Refused: n.Refused, Tiers: []nodeTierJSON{},
					Latency: peerLatencyView(n.Latency)}
				if n.DrainingSinceUnixMs != 0 {
					out[i].DrainingSince = rfc3339(n.DrainingSinceUnixMs)
				}
				for _, t := range n.Tiers {
					out[i].Tiers = append(out[i].Tiers, nodeTierJSON{Tier: t.Tier, Capacity: t.Capacity, Free: t.Free})
				}
			}
			if g.output == "json" {
				return g.printJSON(out)
			}
			w := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSTATE\tZONE\tGOSSIP\tCONTROL\tDATA\tREAD LATENCY\tFREE")
			for _, n := range out {
				name, state := n.Name, n.State
				if n.Self {
					name += " (self)"
				}
				if n.Draining {
					state += ",draining"
				}
				if n.Evacuating {
					state += ",evacuating"
				}
				if n.Refused != "" {
					state += ",refused" // -o json says why
				}
				var free []string
				for _, t := range n.Tiers {
					free = append(free, fmt.Sprintf("%s %s/%s", t.Tier, human(t.Free), human(t.Capacity)))
				}
				freeText := strings.Join(free, ", ")
				switch {
				case n.Draining && n.Evacuating:
					freeText += " (draining: takes no new segments; evacuating: its segments move to other nodes"
				case n.Draining:
					freeText += " (draining: takes no new segments; its segments stay"
				}
				if n.Draining {
					if n.DrainingSince != "" { // a poold that predates the field gossips none
						freeText += "; since " + n.DrainingSince
					}
					freeText = strings.TrimSpace(freeText + ")")
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, state, dash(n.Zone), dash(n.GossipAddr), dash(n.GRPCAddr), dash(n.DataAddr), latencyCell(n.Latency), freeText)
			}
			for _, n := range out {
				if n.Latency != nil && n.Latency.Unmeasured != "" {
					fmt.Fprintf(w, "\n%s unmeasured: %s", n.Name, n.Latency.Unmeasured)
				}
			}
			printConflicts(w, resp.NameConflicts)
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&matrix, "matrix", false, "print the cluster's latency matrix: every alive node's measurements of the others")
	return cmd
}

// printMatrix writes the latency matrix: a row per node measuring, a
// column per node measured, then why any figure is missing.
func printMatrix(g *globals, resp *poolv1.NodesResponse) error {
	rows := make([]latencyRowJSON, len(resp.Matrix))
	for i, r := range resp.Matrix {
		rows[i] = latencyRowJSON{From: r.From, To: []peerLatencyJSON{}, Error: r.Error}
		for _, l := range r.To {
			rows[i].To = append(rows[i].To, *peerLatencyView(l))
		}
	}
	if g.output == "json" {
		return g.printJSON(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(g.out, "no cluster: this poold gossips with nobody (poold --gossip)")
		return nil
	}
	var names []string
	for _, r := range rows {
		names = append(names, r.From)
	}
	slices.Sort(names)
	w := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FROM \\ TO\t"+strings.Join(names, "\t"))
	var why []string
	for _, r := range rows {
		cells := make([]string, len(names))
		for i, to := range names {
			cells[i] = "-"
			j := slices.IndexFunc(r.To, func(l peerLatencyJSON) bool { return l.Node == to })
			if j < 0 {
				continue
			}
			cells[i] = latencyCell(&r.To[j])
			if u := r.To[j].Unmeasured; u != "" {
				why = append(why, fmt.Sprintf("%s → %s unmeasured: %s", r.From, to, u))
			}
		}
		if r.Error != "" {
			why = append(why, fmt.Sprintf("%s's row: %s", r.From, r.Error))
		}
		fmt.Fprintf(w, "%s\t%s\n", r.From, strings.Join(cells, "\t"))
	}
	for _, s := range why {
		fmt.Fprintf(w, "\n%s", s)
	}
	if len(why) > 0 {
		fmt.Fprintln(w)
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
