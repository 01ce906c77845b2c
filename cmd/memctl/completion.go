package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

// addCompletions teaches the shell completion scripts (cobra's "memctl
// completion bash|zsh|fish|powershell") the values memctl's flags and
// arguments take: fixed lists for -o and --tier, and, asked from the
// daemon, segment names and ids for free and move, and node names for
// drain and move --to.
func addCompletions(root *cobra.Command, g *globals) {
	// cobra adds its completion command at Execute; add it now to make an
	// unknown shell an error (cobra prints the help and exits 0). The
	// scripts go to the writer the command has when it is made.
	root.SetOut(g.out)
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("completion %q: memctl writes scripts for bash, zsh, fish and powershell", args[0])
			}
			return c.Help()
		}
	}
	root.RegisterFlagCompletionFunc("output", fixedCompletions("table", "json"))
	for _, c := range root.Commands() {
		switch c.Name() {
		case "alloc":
			c.RegisterFlagCompletionFunc("tier", fixedCompletions(tier.Names()...))
			c.RegisterFlagCompletionFunc("size", fixedCompletions("1MiB", "64MiB", "1GiB"))
			c.RegisterFlagCompletionFunc("name", cobra.NoFileCompletions)
		case "free":
			c.ValidArgsFunction = g.completeSegments
		case "drain":
			c.ValidArgsFunction = g.completeNodes
		case "move":
			c.ValidArgsFunction = g.completeSegments
			c.RegisterFlagCompletionFunc("to", func(c *cobra.Command, _ []string, s string) ([]string, cobra.ShellCompDirective) {
				return g.completeNodes(c, nil, s)
			})
			c.RegisterFlagCompletionFunc("tier", fixedCompletions(tier.Name(poolv1.Tier_TIER_RDMA), tier.Name(poolv1.Tier_TIER_CXL), tier.Name(poolv1.Tier_TIER_LOCAL)))
		}
	}
}

func fixedCompletions(values ...string) cobra.CompletionFunc {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

// completionCall is g.call with a short deadline: a shell waits for it on
// every tab, and no daemon means no suggestions, not an error.
func (g *globals) completionCall(fn func(context.Context, poolv1.PoolClient) error) error {
	cg := *g
	cg.timeout = min(g.timeout, 2*time.Second)
	return cg.call(fn)
}

// completeSegments suggests the segments free and move take: names, and ids of
// unnamed segments, each with its size and tier as description.
func (g *globals) completeSegments(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	g.completionCall(func(ctx context.Context, c poolv1.PoolClient) error {
		segs, err := poolv1.ListAll(ctx, c, &poolv1.ListRequest{}, 0)
		if err != nil {
			return err
		}
		for _, s := range segs {
			v := s.Name
			if v == "" {
				v = strconv.FormatUint(s.Id, 10)
			}
			out = append(out, fmt.Sprintf("%s\t%s on %s", v, human(s.Size), tier.Name(s.Tier)))
		}
		return nil
	})
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeNodes suggests the cluster's node names for drain.
func (g *globals) completeNodes(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	g.completionCall(func(ctx context.Context, c poolv1.PoolClient) error {
		resp, err := c.Nodes(ctx, &poolv1.NodesRequest{})
		if err != nil {
			return err
		}
		for _, n := range resp.Nodes {
			out = append(out, fmt.Sprintf("%s\t%s", n.Name, n.State))
		}
		return nil
	})
	return out, cobra.ShellCompDirectiveNoFileComp
}
