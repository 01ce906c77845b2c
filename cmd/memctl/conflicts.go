package main

import (
	"fmt"
	"io"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// conflictJSON is a node name gossiped from two addresses, as -o json prints it.
type conflictJSON struct {
	Name     string `json:"name"`
	Known    string `json:"known_addr"`
	Claimant string `json:"claimant_addr"`
	Self     bool   `json:"self"`
	First    string `json:"first_seen"`
	Last     string `json:"last_seen"`
	Count    uint64 `json:"count"`
}

func conflictsJSON(cs []*poolv1.NameConflict) []conflictJSON {
	out := []conflictJSON{}
	for _, c := range cs {
		out = append(out, conflictJSON{Name: c.Name, Known: c.KnownAddr, Claimant: c.ClaimantAddr, Self: c.Self,
			First: time.UnixMilli(c.FirstUnixMs).UTC().Format(time.RFC3339), Last: time.UnixMilli(c.LastUnixMs).UTC().Format(time.RFC3339), Count: c.Count})
	}
	return out
}

// conflictProblem says what a name conflict means and how to end it.
func conflictProblem(c *poolv1.NameConflict) (what, fix string) {
	holder := fmt.Sprintf("the node at %s", c.KnownAddr)
	if c.Self {
		holder = fmt.Sprintf("this poold (%s)", c.KnownAddr)
	}
	what = fmt.Sprintf("node name %q is held by %s and was also claimed by a poold gossiping at %s (%d times, last %s ago): gossip ignores that second poold, so no peer places memory there",
		c.Name, holder, c.ClaimantAddr, c.Count, time.Since(time.UnixMilli(c.LastUnixMs)).Round(time.Second))
	fix = fmt.Sprintf("restart the poold that gossips at %s with a unique --node NAME (it defaults to the host name)", c.ClaimantAddr)
	return what, fix
}

// printConflicts writes one warning per name conflict; nothing when none.
func printConflicts(w io.Writer, cs []*poolv1.NameConflict) {
	for _, c := range cs {
		what, fix := conflictProblem(c)
		fmt.Fprintf(w, "\nWARNING: %s\n  fix: %s\n", what, fix)
	}
}
