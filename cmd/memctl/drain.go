package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// drainEffect says what a drain does; evacuateEffect what --evacuate adds.
const (
	drainEffect    = "no new placements; its segments stay unless --evacuate moves them"
	evacuateEffect = "evacuating: moving the segments its peers placed there to other nodes"
)

// drainWait is how often drain --wait shows the progress; drainPoll how
// often it asks for it, so that it returns soon after the evacuation ends.
const (
	drainWait = time.Second
	drainPoll = 100 * time.Millisecond
)

func newDrainCmd(g *globals) *cobra.Command {
	var undo, evacuate, wait bool
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new placements on a node (--evacuate: and move its segments off) until --undo, across restarts",
		Long: "Stop new placements on NODE: peers place no segments there and leave its free space out\n" +
			"of the cluster's FREE (applications of NODE's own daemon still allocate on it). NODE's\n" +
			"daemon keeps the drain in its metadata store, so it holds across restarts until\n" +
			"'memctl drain NODE --undo'. Any daemon of the cluster forwards the request to NODE's daemon.\n\n" +
			"--evacuate also moves the segments peers placed on NODE to other nodes while their\n" +
			"applications use them; it resumes after a restart of NODE's daemon. Segments of NODE's own\n" +
			"applications stay: they leave with their applications. --wait shows the progress every\n" +
			"second and exits 0 when nothing is left to move, non-zero when the evacuation is stuck for\n" +
			"longer than --stuck-grace or when --timeout (if given) passes.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			switch {
			case undo && (evacuate || wait):
				return fmt.Errorf("%w: --undo ends the drain and its evacuation; drop --evacuate and --wait", errs.ErrInvalid)
			case wait && !evacuate:
				return fmt.Errorf("%w: --wait waits for an evacuation; add --evacuate", errs.ErrInvalid)
			case grace <= 0:
				return fmt.Errorf("%w: --stuck-grace %s: give a positive duration, e.g. 30s", errs.ErrInvalid, grace)
			}
			resp, err := g.drain(&poolv1.DrainRequest{Node: node, Undo: undo, Evacuate: evacuate})
			if err != nil {
				return err
			}
			if resp.Node == "" { // a poold that predates the answer's fields: it did as asked
				resp = &poolv1.DrainResponse{Node: node, Draining: !undo, Changed: true}
			}
			if evacuate && !resp.Evacuating {
				return fmt.Errorf("%w: the daemon of %s drains but does not evacuate: it predates --evacuate; upgrade it", errs.ErrNotSupported, resp.Node)
			}
			if wait {
				var limit time.Duration
				if cmd.Flags().Changed("timeout") {
					limit = g.timeout
				}
				return g.waitEvacuation(resp, grace, limit)
			}
			if g.output == "json" {
				return g.printJSON(drainJSON(resp))
			}
			switch {
			case undo && resp.Changed:
				fmt.Fprintf(g.out, "%s accepts placements again\n", resp.Node)
			case undo:
				fmt.Fprintf(g.out, "%s was not draining; nothing to undo\n", resp.Node)
			case resp.Changed:
				fmt.Fprintf(g.out, "%s is %s\n", resp.Node, drainingText(resp.DrainingSinceUnixMs, resp.Evacuating))
			default:
				fmt.Fprintf(g.out, "%s was already %s\n", resp.Node, drainingText(resp.DrainingSinceUnixMs, resp.Evacuating))
			}
			if resp.Evacuating {
				fmt.Fprintf(g.out, "%s\n", evacuationText(resp.Node, resp.Evacuation))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&undo, "undo", false, "accept placements again (and end an evacuation)")
	cmd.Flags().BoolVar(&evacuate, "evacuate", false, "also move the segments peers placed on NODE to other nodes")
	cmd.Flags().BoolVar(&wait, "wait", false, "with --evacuate: show the progress until nothing is left to move")
	cmd.Flags().DurationVar(&grace, "stuck-grace", 30*time.Second, "with --wait: how long the evacuation may be stuck before memctl gives up (it goes on)")
	return cmd
}

// drain sends req to the daemon.
func (g *globals) drain(req *poolv1.DrainRequest) (resp *poolv1.DrainResponse, err error) {
	err = g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
		resp, err = c.Drain(ctx, req)
		return err
	})
	return resp, err
}

// waitEvacuation asks for the evacuation's progress every drainPoll and
// shows it every drainWait until it is done (nil), stuck for longer than
// grace, ended by an undo, or limit (if not 0) has passed. Failed queries
// (the node's daemon restarting) are retried for as long as grace.
func (g *globals) waitEvacuation(resp *poolv1.DrainResponse, grace, limit time.Duration) error {
	node, start := resp.Node, time.Now()
	var stuckSince, failingSince, shown time.Time
	for {
		ev := resp.GetEvacuation()
		switch {
		case !resp.Evacuating:
			return fmt.Errorf("the evacuation of %s ended before it was done ('memctl drain %s --undo'?)", node, node)
		case ev.GetDone():
			if g.output == "json" {
				return g.printJSON(drainJSON(resp))
			}
			fmt.Fprintln(g.out, evacuationText(node, ev))
			return nil
		case ev.GetStuck() == "":
			stuckSince = time.Time{}
		case stuckSince.IsZero():
			stuckSince = time.Now()
		case time.Since(stuckSince) > grace:
			return fmt.Errorf("%w: the evacuation of %s is stuck for %s: %s (it goes on; 'memctl drain %s --undo' ends it)",
				errStuck, node, time.Since(stuckSince).Round(time.Second), ev.Stuck, node)
		}
		if limit > 0 && time.Since(start) > limit {
			return fmt.Errorf("%w: the evacuation of %s is not done after --timeout %s: %d segments (%s) left (it goes on; run the command again to keep waiting)",
				context.DeadlineExceeded, node, limit, ev.GetSegmentsLeft(), human(int64(ev.GetBytesLeft())))
		}
		if g.output != "json" && time.Since(shown) >= drainWait {
			fmt.Fprintln(g.out, progressLine(node, ev))
			shown = time.Now()
		}
		time.Sleep(drainPoll)
		next, err := g.drain(&poolv1.DrainRequest{Node: node, Query: true})
		switch {
		case err == nil:
			resp, failingSince = next, time.Time{}
		case errors.Is(err, errs.ErrAccessDenied) || errors.Is(err, errs.ErrInvalid):
			return err
		case failingSince.IsZero():
			failingSince = time.Now()
			fallthrough
		case time.Since(failingSince) <= grace:
			if g.output != "json" && time.Since(shown) >= drainWait {
				fmt.Fprintf(g.out, "%s: no answer (%v); asking again\n", node, err)
				shown = time.Now()
			}
		default:
			return fmt.Errorf("the evacuation of %s: no answer for %s: %w", node, grace, err)
		}
	}
}

// errStuck marks a wait that gave up because the evacuation is stuck.
var errStuck = errs.Sub(errs.ErrNoCapacity, "evacuation stuck")

// progressLine is one line of drain --wait.
func progressLine(node string, ev *poolv1.Evacuation) string {
	if ev == nil {
		return node + ": evacuation starting"
	}
	s := fmt.Sprintf("%s: moved %d segments (%s), left %d (%s), %.1f MB/s, ETA %s", node,
		ev.SegmentsMoved, human(int64(ev.BytesMoved)), ev.SegmentsLeft, human(int64(ev.BytesLeft)), ev.BytesPerSecond/1e6, etaText(ev))
	if ev.SegmentsFailed > 0 {
		s += fmt.Sprintf(", %d failed (retrying)", ev.SegmentsFailed)
	}
	if ev.Stuck != "" {
		s += "; stuck: " + ev.Stuck
	}
	return s
}

func etaText(ev *poolv1.Evacuation) string {
	if ev.EtaMs <= 0 {
		return "unknown"
	}
	return (time.Duration(ev.EtaMs) * time.Millisecond).Round(time.Second).String()
}

// evacuationText describes an evacuation in a sentence.
func evacuationText(node string, ev *poolv1.Evacuation) string {
	if ev == nil {
		return node + ": the evacuation is starting"
	}
	var s string
	switch {
	case ev.Done:
		s = fmt.Sprintf("%s is evacuated: no segment of a peer is left on it (moved %d segments, %s, at %.1f MB/s)",
			node, ev.SegmentsMoved, human(int64(ev.BytesMoved)), ev.BytesPerSecond/1e6)
	case ev.Stuck != "":
		s = fmt.Sprintf("%s: %d segments (%s) left to move, stuck: %s", node, ev.SegmentsLeft, human(int64(ev.BytesLeft)), ev.Stuck)
	default:
		s = progressLine(node, ev)
	}
	if ev.SegmentsStaying > 0 {
		s += fmt.Sprintf("; %d segments (%s) of %s's own applications stay (they leave with their applications)",
			ev.SegmentsStaying, human(int64(ev.BytesStaying)), node)
	}
	return s
}

// drainJSON is a drain's answer as -o json prints it.
func drainJSON(resp *poolv1.DrainResponse) map[string]any {
	return map[string]any{"node": resp.Node, "draining": resp.Draining, "changed": resp.Changed,
		"draining_since": optRFC3339(resp.DrainingSinceUnixMs), "evacuating": resp.Evacuating,
		"evacuation": evacuationJSON(resp.Evacuation)}
}

// evacuationJSON is an evacuation's progress as -o json prints it; nil
// (JSON null) when there is none.
func evacuationJSON(ev *poolv1.Evacuation) any {
	if ev == nil {
		return nil
	}
	return map[string]any{
		"segments_moved": ev.SegmentsMoved, "bytes_moved": ev.BytesMoved,
		"segments_left": ev.SegmentsLeft, "bytes_left": ev.BytesLeft,
		"bytes_per_second": ev.BytesPerSecond, "eta_ms": ev.EtaMs,
		"segments_failed": ev.SegmentsFailed, "stuck": ev.Stuck, "done": ev.Done,
		"segments_staying": ev.SegmentsStaying, "bytes_staying": ev.BytesStaying,
		"since": optRFC3339(ev.SinceUnixMs),
	}
}

// drainingText describes a drain that began at sinceMs (Unix ms; 0 when
// the daemon did not say), and whether it evacuates.
func drainingText(sinceMs int64, evacuating bool) string {
	effect := drainEffect
	if evacuating {
		effect = evacuateEffect
	}
	if sinceMs == 0 {
		return "draining: " + effect
	}
	return fmt.Sprintf("draining since %s (%s ago): %s", rfc3339(sinceMs),
		time.Since(time.UnixMilli(sinceMs)).Round(time.Second), effect)
}

// rfc3339 formats Unix milliseconds as UTC RFC 3339.
func rfc3339(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }

// optRFC3339 is rfc3339 of ms, or nil (JSON null) for 0.
func optRFC3339(ms int64) any {
	if ms == 0 {
		return nil
	}
	return rfc3339(ms)
}
