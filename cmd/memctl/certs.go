package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
)

// channel is the gRPC channel to poold: the unix socket, or --addr over
// mutual TLS when --tls-cert/--tls-key/--tls-ca are set (plaintext without
// them, which only a daemon started with --insecure accepts).
func (g *globals) channel(network, addr string) (*grpc.ClientConn, error) {
	if network != "tcp" || g.tls.IsZero() {
		return session.Channel(network, addr)
	}
	tc, err := g.tls.Client()
	if err != nil {
		return nil, err
	}
	return session.ChannelTLS(network, addr, tc)
}

// allocTLS is the alloc.Dial option for --addr with --tls-* (none without).
func (g *globals) allocTLS() ([]alloc.DialOption, error) {
	if g.addr == "" || g.tls.IsZero() {
		return nil, nil
	}
	tc, err := g.tls.Client()
	if err != nil {
		return nil, err
	}
	return []alloc.DialOption{alloc.WithTLS(tc)}, nil
}

func newCertsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make certificates for poold's mutual TLS",
	}
	var (
		dir      string
		nodes    []string
		clients  []string
		validity time.Duration
	)
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a CA and node and client certificates in a directory",
		Long: `init creates, in --dir, a small certificate authority (ca.crt, ca.key)
unless the directory holds one already, and signs with it a certificate and
key per node (NAME.crt, NAME.key: for poold --tls-cert/--tls-key, valid for
the node name, localhost, 127.0.0.1 and the IPs given; its common name is
the node name, which peers check) and per client (for
memctl --tls-cert or alloc.LoadTLS; the common name is the identity poold
sees). Keys are ECDSA P-256, written with mode 0600. With nodes it also
writes the cluster's gossip key (gossip.key, 32 random bytes in base64, for
poold --gossip-key-file) unless the directory holds one. Give every poold
--tls-ca DIR/ca.crt. Keep ca.key off the nodes: it signs new identities.

  memctl certs init --dir /etc/farmem/tls --nodes a=10.0.0.5,b=10.0.0.6 --clients admin`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := certs.InitOptions{Clients: clients, Validity: validity}
			for _, s := range nodes {
				n, err := certs.ParseNode(s)
				if err != nil {
					return err
				}
				o.Nodes = append(o.Nodes, n)
			}
			files, err := certs.Init(dir, o)
			if err != nil {
				return err
			}
			for _, f := range files {
				fmt.Fprintln(g.out, f)
			}
			return nil
		},
	}
	f := initCmd.Flags()
	f.StringVar(&dir, "dir", "", "directory for the CA and the certificates (created 0700)")
	f.StringSliceVar(&nodes, "nodes", nil, "node names, each optionally with its IPs: NAME[=IP[+IP...]], comma-separated")
	f.StringSliceVar(&clients, "clients", nil, "client names (identities), comma-separated")
	f.DurationVar(&validity, "validity", certs.DefaultValidity, "how long the certificates are valid")
	initCmd.MarkFlagRequired("dir")
	cmd.AddCommand(initCmd)
	return cmd
}

// quotaJSON is one identity's usage of one tier beside its quota.
type quotaJSON struct {
	Identity   string `json:"identity"`
	Tier       string `json:"tier"`
	UsedBytes  int64  `json:"used_bytes"`
	QuotaBytes int64  `json:"quota_bytes"` // 0: no quota
}

func quotasJSON(qs []*poolv1.QuotaUsage) []quotaJSON {
	out := make([]quotaJSON, len(qs))
	for i, q := range qs {
		out[i] = quotaJSON{Identity: q.Identity, Tier: tier.Name(q.Tier), UsedBytes: q.UsedBytes, QuotaBytes: q.QuotaBytes}
	}
	return out
}

// printSecurity adds to memctl status a warning for a plaintext TCP
// control plane or gossip, how the data plane is protected (a warning
// for --data-insecure) and each identity's usage beside its quota.
func printSecurity(w io.Writer, st *poolv1.StatusResponse) {
	if st.Insecure {
		fmt.Fprintln(w, "\nWARNING: the TCP control plane serves without TLS (--insecure): anyone who reaches it can allocate and free")
	}
	if st.GossipInsecure {
		fmt.Fprintln(w, "\nWARNING: gossip is not sealed (no --gossip-key-file): anyone who reaches the gossip port can join the cluster and announce capacity")
	}
	if strings.Contains(st.DataSecurity, "--data-insecure") {
		fmt.Fprintln(w, "\nWARNING: the data plane serves without TLS (--data-insecure): credentials, keys and data cross the network readable")
	} else if st.DataSecurity != "" {
		fmt.Fprintf(w, "\ndata plane: %s\n", st.DataSecurity)
	}
	if len(st.Quotas) == 0 {
		return
	}
	fmt.Fprintln(w, "\nIDENTITY\tTIER\tUSED\tQUOTA")
	for _, q := range st.Quotas {
		quota := "-"
		if q.QuotaBytes > 0 {
			quota = size.Size(q.QuotaBytes).Human()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", q.Identity, tier.Name(q.Tier), size.Size(q.UsedBytes).Human(), quota)
	}
}
