package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's version, node, uptime and tiers",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var st *poolv1.StatusResponse
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				st, err = c.Status(ctx, &poolv1.StatusRequest{})
				return err
			})
			if err != nil {
				return err
			}
			uptime := time.Since(time.UnixMilli(st.StartedUnixMs)).Round(time.Second)
			if g.output == "json" {
				tiers := make([]tierJSON, len(st.Tiers))
				for i, t := range st.Tiers {
					tiers[i] = tierView(t)
				}
				return g.printJSON(map[string]any{
					"version": st.Version, "node": st.Node, "pid": st.Pid, "uptime_seconds": int64(uptime.Seconds()),
					"started": rfc3339(st.StartedUnixMs), "data_dir": st.DataDir,
					"socket": st.Socket, "sessions": st.Sessions, "segments": st.Segments,
					"lease_ttl_ms": st.LeaseTtlMs, "tiers": tiers,
					"insecure": st.Insecure, "data_security": st.DataSecurity, "quotas": quotasJSON(st.Quotas),
					"name_conflicts":  conflictsJSON(st.NameConflicts),
					"gossip_insecure": st.GossipInsecure,
					"gossip_cluster":  st.GossipCluster,
					"draining":        st.DrainingSinceUnixMs != 0, "draining_since": optRFC3339(st.DrainingSinceUnixMs),
					"zone":       st.Zone,
					"evacuating": st.Evacuating, "evacuation": evacuationJSON(st.Evacuation),
				})
			}
			w := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			zone := ""
			if st.Zone != "" {
				zone = ", zone " + st.Zone
			}
			if st.GossipCluster != "" {
				zone += fmt.Sprintf(", cluster %q", st.GossipCluster)
			}
			fmt.Fprintf(w, "poold %s on node %s%s (pid %d), up %s\n", st.Version, st.Node, zone, st.Pid, uptime)
			fmt.Fprintf(w, "socket %s, data %s, %d sessions, %d segments, lease TTL %s\n\n", st.Socket, st.DataDir, st.Sessions, st.Segments, time.Duration(st.LeaseTtlMs)*time.Millisecond)
			if st.DrainingSinceUnixMs != 0 {
				fmt.Fprintf(w, "node %s is %s\n", st.Node, drainingText(st.DrainingSinceUnixMs, st.Evacuating))
				if st.Evacuating {
					fmt.Fprintln(w, evacuationText(st.Node, st.Evacuation))
				}
				fmt.Fprintln(w)
			}
			printTiers(w, st.Tiers)
			printSecurity(w, st)
			printConflicts(w, st.NameConflicts)
			return w.Flush()
		},
	}
}
