package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

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
}

type nodeTierJSON struct {
	Tier     string `json:"tier"`
	Capacity int64  `json:"capacity"`
	Free     int64  `json:"free"`
}

func newNodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes: state, addresses, free memory per tier",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var resp *poolv1.NodesResponse
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				resp, err = c.Nodes(ctx, &poolv1.NodesRequest{})
				return err
			})
			if err != nil {
				return err
			}
			out := make([]nodeJSON, len(resp.Nodes))
			for i, n := range resp.Nodes {
				out[i] = nodeJSON{Name: n.Name, State: n.State, Self: n.Self, Zone: n.Zone, Draining: n.Draining, Evacuating: n.Evacuating,
					GossipAddr: n.GossipAddr, GRPCAddr: n.GrpcAddr, DataAddr: n.DataAddr, Refused: n.Refused, Tiers: []nodeTierJSON{}}
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
			fmt.Fprintln(w, "NAME\tSTATE\tZONE\tGOSSIP\tCONTROL\tDATA\tFREE")
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
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, state, dash(n.Zone), dash(n.GossipAddr), dash(n.GRPCAddr), dash(n.DataAddr), freeText)
			}
			printConflicts(w, resp.NameConflicts)
			return w.Flush()
		},
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
