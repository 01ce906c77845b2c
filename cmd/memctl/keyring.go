package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
)

// errKeyring marks a keyring command that failed on some node; the
// output names each.
var errKeyring = errors.New("keyring: not every node answered or changed")

func newKeyringCmd(g *globals) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "keyring",
		Short: "List and rotate the gossip keys of every node (install, use, remove)",
		Long: `keyring shows and changes the keys that seal gossip (AES-GCM). The daemon
memctl talks to forwards each command to every alive node; --local changes
only that daemon. Each node keeps its keyring in DATA-DIR/gossip.keyring.

Rotation without downtime:

  memctl keyring install NEWKEY   # every node accepts gossip sealed with it
  memctl keyring use NEWKEY       # every node seals with it
  memctl keyring remove OLDKEY    # no node accepts the old key any more

A node that was down is listed as not reached and, when it restarts with
the old keys, is not admitted; run install and use with --local on it
(memctl --socket of that node), and it rejoins. Put the new key in the
gossip-key-file too, for nodes that start with an empty data directory.

KEY is base64 of 16, 24 or 32 bytes (head -c 32 /dev/urandom | base64).
Only administrators may use it (poold --admin; default root and poold's
uid on the socket).`,
	}
	cmd.PersistentFlags().BoolVar(&local, "local", false, "change only the daemon memctl talks to, not every node")
	run := func(op poolv1.KeyringOp) func(*cobra.Command, []string) error {
		return func(_ *cobra.Command, args []string) error {
			req := &poolv1.KeyringRequest{Op: op, Local: local}
			if len(args) == 1 {
				key, err := cluster.ParseKey(args[0])
				if err != nil {
					return err
				}
				req.Key = key
			}
			var resp *poolv1.KeyringResponse
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				resp, err = c.Keyring(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			return g.printKeyring(resp)
		}
	}
	for _, sub := range []struct {
		use, short string
		op         poolv1.KeyringOp
	}{
		{"list", "Each node's keys by fingerprint, the primary first", poolv1.KeyringOp_KEYRING_OP_LIST},
		{"install KEY", "Accept gossip sealed with KEY", poolv1.KeyringOp_KEYRING_OP_INSTALL},
		{"use KEY", "Seal gossip with KEY (install it first)", poolv1.KeyringOp_KEYRING_OP_USE},
		{"remove KEY", "Stop accepting KEY (not the primary)", poolv1.KeyringOp_KEYRING_OP_REMOVE},
	} {
		args := cobra.ExactArgs(1)
		if sub.op == poolv1.KeyringOp_KEYRING_OP_LIST {
			args = cobra.NoArgs
		}
		cmd.AddCommand(&cobra.Command{Use: sub.use, Short: sub.short, Args: args, RunE: run(sub.op)})
	}
	return cmd
}

// printKeyring shows each node's keyring, or why it was not changed; an
// error when any node failed.
func (g *globals) printKeyring(resp *poolv1.KeyringResponse) error {
	failed := 0
	for _, n := range resp.Nodes {
		if n.Error != "" {
			failed++
		}
	}
	if g.output == "json" {
		type nodeJSON struct {
			Node         string   `json:"node"`
			Fingerprints []string `json:"fingerprints"`
			Error        string   `json:"error,omitempty"`
		}
		out := make([]nodeJSON, len(resp.Nodes))
		for i, n := range resp.Nodes {
			out[i] = nodeJSON{Node: n.Node, Fingerprints: n.Fingerprints, Error: n.Error}
		}
		if err := g.printJSON(out); err != nil {
			return err
		}
	} else {
		w := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NODE\tPRIMARY\tOTHER KEYS\tERROR")
		for _, n := range resp.Nodes {
			primary, others := "-", "-"
			if len(n.Fingerprints) > 0 {
				primary = n.Fingerprints[0]
			}
			if len(n.Fingerprints) > 1 {
				others = strings.Join(n.Fingerprints[1:], ",")
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", n.Node, primary, others, n.Error)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d nodes; see the ERROR column", errKeyring, failed, len(resp.Nodes))
	}
	return nil
}
