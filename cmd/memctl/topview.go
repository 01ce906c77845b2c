package main

import (
	"bytes"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

// topView is one refresh of memctl top, as -o json prints it.
type topView struct {
	Time    string `json:"time"`
	Version string `json:"version"`
	Node    string `json:"node"`
	Pid     int64  `json:"pid"`
	Uptime  int64  `json:"uptime_seconds"`
	// Seconds between the two samples the rates are measured over; 0 when
	// there is no earlier sample (first view, or the daemon restarted).
	RateWindow float64     `json:"rate_window_seconds"`
	Sessions   int64       `json:"sessions"`
	Segments   int64       `json:"segments"`
	Tiers      []topTier   `json:"tiers"`
	Clients    []topClient `json:"clients"`
	Nodes      []nodeJSON  `json:"nodes,omitempty"` // in a cluster only
	at         time.Time
	interval   time.Duration
}

type topTier struct {
	Tier     string    `json:"tier"`
	Kind     string    `json:"kind"`
	Emulated bool      `json:"emulated"`
	Capacity int64     `json:"capacity"`
	Used     int64     `json:"used"`
	Free     int64     `json:"free"`
	Segments int64     `json:"segments"`
	Totals   topOps    `json:"totals"`          // since the daemon started
	Rates    *topRates `json:"rates,omitempty"` // per second; absent without an earlier sample
}

type topOps struct {
	Allocations int64 `json:"allocations"`
	Frees       int64 `json:"frees"`
	Reads       int64 `json:"reads"`
	Writes      int64 `json:"writes"`
	Atomics     int64 `json:"atomics"`
	ReadBytes   int64 `json:"read_bytes"`
	WriteBytes  int64 `json:"write_bytes"`
}

type topRates struct {
	Allocations float64 `json:"allocations_per_second"`
	Frees       float64 `json:"frees_per_second"`
	Reads       float64 `json:"reads_per_second"`
	Writes      float64 `json:"writes_per_second"`
	Atomics     float64 `json:"atomics_per_second"`
	ReadBytes   float64 `json:"read_bytes_per_second"`
	WriteBytes  float64 `json:"write_bytes_per_second"`
}

type topClient struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Pid      int64  `json:"pid"`
	UID      uint32 `json:"uid"`
	Sessions int64  `json:"sessions"`
	Segments int64  `json:"segments"`
	Bytes    int64  `json:"bytes"`
	// held: a session keeps the lease; expiring: no session, unpinned
	// segments go at lease_expires; gone: only pinned segments remain.
	Lease        string `json:"lease"`
	LeaseExpires string `json:"lease_expires,omitempty"`
}

func opsView(o *poolv1.TierOps) topOps {
	if o == nil {
		return topOps{}
	}
	return topOps{Allocations: o.Allocations, Frees: o.Frees, Reads: o.Reads, Writes: o.Writes,
		Atomics: o.Atomics, ReadBytes: o.ReadBytes, WriteBytes: o.WriteBytes}
}

// rates divides what the counters grew by over dt; nil when a counter went
// back (the daemon restarted between the samples).
func rates(prev, cur topOps, dt float64) *topRates {
	p := []int64{prev.Allocations, prev.Frees, prev.Reads, prev.Writes, prev.Atomics, prev.ReadBytes, prev.WriteBytes}
	c := []int64{cur.Allocations, cur.Frees, cur.Reads, cur.Writes, cur.Atomics, cur.ReadBytes, cur.WriteBytes}
	r := make([]float64, len(c))
	for i := range c {
		if c[i] < p[i] || dt <= 0 {
			return nil
		}
		r[i] = float64(c[i]-p[i]) / dt
	}
	return &topRates{Allocations: r[0], Frees: r[1], Reads: r[2], Writes: r[3], Atomics: r[4], ReadBytes: r[5], WriteBytes: r[6]}
}

// newTopView builds the view of cur, with rates since prev (which may be nil).
func newTopView(prev, cur *topSample, interval time.Duration) *topView {
	st := cur.st
	v := &topView{
		Time: cur.at.UTC().Format(time.RFC3339), Version: st.Version, Node: st.Node, Pid: st.Pid,
		Uptime:   int64(cur.at.Sub(time.UnixMilli(st.StartedUnixMs)).Seconds()),
		Sessions: st.Sessions, Segments: st.Segments, Tiers: []topTier{}, Clients: []topClient{}, at: cur.at, interval: interval,
	}
	comparable := prev != nil && prev.st.StartedUnixMs == st.StartedUnixMs && prev.st.Pid == st.Pid && prev.st.Node == st.Node
	var dt float64
	if comparable {
		dt = cur.at.Sub(prev.at).Seconds()
		v.RateWindow = dt
	}
	opsOf := func(s *poolv1.StatusResponse, t poolv1.Tier) *poolv1.TierOps {
		for _, o := range s.Ops {
			if o.Tier == t {
				return o
			}
		}
		return nil
	}
	for _, t := range st.Tiers {
		tt := topTier{Tier: tier.Name(t.Tier), Kind: t.Kind, Emulated: t.Emulated, Capacity: t.Capacity,
			Used: t.Capacity - t.Free, Free: t.Free, Segments: t.Segments, Totals: opsView(opsOf(st, t.Tier))}
		if comparable {
			tt.Rates = rates(opsView(opsOf(prev.st, t.Tier)), tt.Totals, dt)
		}
		v.Tiers = append(v.Tiers, tt)
	}
	for _, c := range st.Clients {
		tc := topClient{ID: c.Id, Name: c.Name, Pid: c.Pid, UID: c.Uid, Sessions: c.Sessions, Segments: c.Segments, Bytes: c.Bytes}
		switch {
		case c.Sessions > 0:
			tc.Lease = "held"
		case c.LeaseExpiresUnixMs != 0:
			tc.Lease = "expiring"
			tc.LeaseExpires = time.UnixMilli(c.LeaseExpiresUnixMs).UTC().Format(time.RFC3339Nano)
		default:
			tc.Lease = "gone"
		}
		v.Clients = append(v.Clients, tc)
	}
	inCluster := len(cur.nodes) > 1
	for _, n := range cur.nodes {
		inCluster = inCluster || n.GossipAddr != ""
	}
	if inCluster {
		for _, n := range cur.nodes {
			nj := nodeJSON{Name: n.Name, State: n.State, Self: n.Self, Draining: n.Draining,
				GossipAddr: n.GossipAddr, GRPCAddr: n.GrpcAddr, DataAddr: n.DataAddr, Tiers: []nodeTierJSON{}}
			for _, t := range n.Tiers {
				nj.Tiers = append(nj.Tiers, nodeTierJSON{Tier: t.Tier, Capacity: t.Capacity, Free: t.Free})
			}
			v.Nodes = append(v.Nodes, nj)
		}
	}
	return v
}

// rate prints a per-second rate for people; "-" when there is none yet.
func rate(r *topRates, f func(*topRates) float64) string {
	if r == nil {
		return "-"
	}
	v := f(r)
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	case v < 10000:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.1fk", v/1000)
	}
}

func byteRate(r *topRates, f func(*topRates) float64) string {
	if r == nil {
		return "-"
	}
	return human(int64(f(r))) + "/s"
}

func percent(part, whole int64) string {
	if whole <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}

// render draws the view as text. rows > 0 is the screen's height: the
// client list is cut to fit, saying how many it leaves out.
func (v *topView) render(rows int) []byte {
	var b bytes.Buffer
	at := v.at
	fmt.Fprintf(&b, "memctl top — poold %s on %s (pid %d), up %s — %s, every %s\n", v.Version, v.Node, v.Pid,
		time.Duration(v.Uptime)*time.Second, at.Local().Format("15:04:05"), v.interval)
	fmt.Fprintf(&b, "%d sessions, %d segments, %d clients\n\n", v.Sessions, v.Segments, len(v.Clients))

	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TIER\tHARDWARE\tCAPACITY\tUSED\tUSE\tSEGMENTS\tALLOC/s\tFREE/s")
	for _, t := range v.Tiers {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", t.Tier, reality(t.Emulated), human(t.Capacity), human(t.Used),
			percent(t.Used, t.Capacity), t.Segments,
			rate(t.Rates, func(r *topRates) float64 { return r.Allocations }),
			rate(t.Rates, func(r *topRates) float64 { return r.Frees }))
	}
	w.Flush()

	// The data plane: only tiers it serves (rdma), or any that saw traffic.
	fmt.Fprintln(&b)
	w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "DATA PLANE\tREADS/s\tREAD\tWRITES/s\tWRITTEN\tATOMICS/s")
	for _, t := range v.Tiers {
		o := t.Totals
		if t.Tier != "rdma" && o.Reads+o.Writes+o.Atomics == 0 {
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Tier,
			rate(t.Rates, func(r *topRates) float64 { return r.Reads }),
			byteRate(t.Rates, func(r *topRates) float64 { return r.ReadBytes }),
			rate(t.Rates, func(r *topRates) float64 { return r.Writes }),
			byteRate(t.Rates, func(r *topRates) float64 { return r.WriteBytes }),
			rate(t.Rates, func(r *topRates) float64 { return r.Atomics }))
	}
	w.Flush()
	fmt.Fprintln(&b, "(one-sided operations served by this daemon; loads and stores to mapped memory bypass it)")

	if len(v.Nodes) > 0 {
		fmt.Fprintln(&b)
		w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NODE\tSTATE\tFREE")
		for _, n := range v.Nodes {
			name, state := n.Name, n.State
			if n.Self {
				name += " (self)"
			}
			if n.Draining {
				state += ",draining"
			}
			var free []string
			for _, t := range n.Tiers {
				free = append(free, fmt.Sprintf("%s %s/%s", t.Tier, human(t.Free), human(t.Capacity)))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\n", name, state, strings.Join(free, ", "))
		}
		w.Flush()
	}

	fmt.Fprintln(&b)
	clients := v.Clients
	var cut int
	if rows > 0 {
		// What is left of the screen below the tables above: the clients'
		// header, as many clients as fit, and a line saying what was cut.
		room := rows - bytes.Count(b.Bytes(), []byte("\n")) - 1
		if len(clients) > room {
			room-- // for the line saying what was cut
			room = max(room, 0)
			cut = len(clients) - room
			clients = clients[:room]
		}
	}
	if len(clients) > 0 {
		w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "CLIENT\tPID\tUID\tSESSIONS\tSEGMENTS\tBYTES\tLEASE\tID")
		for _, c := range clients {
			lease := c.Lease
			if c.LeaseExpires != "" {
				if exp, err := time.Parse(time.RFC3339Nano, c.LeaseExpires); err == nil {
					lease = fmt.Sprintf("expires in %s", max(exp.Sub(at), 0).Round(100*time.Millisecond))
				}
			}
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", dash(c.Name), c.Pid, c.UID, c.Sessions, c.Segments, human(c.Bytes), lease, c.ID)
		}
		w.Flush()
	}
	switch {
	case len(v.Clients) == 0:
		fmt.Fprintln(&b, "no clients")
	case cut > 0 && len(clients) == 0:
		fmt.Fprintf(&b, "%d clients: enlarge the window to see them, or use memctl top -o json\n", cut)
	case cut > 0:
		fmt.Fprintf(&b, "… and %d more clients (memctl top -o json lists them all)\n", cut)
	}
	return b.Bytes()
}
