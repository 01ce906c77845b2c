package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// ANSI sequences for a full-screen view that refreshes in place.
const (
	ansiAltScreen  = "\x1b[?1049h" // a screen of its own, restored on exit as top does
	ansiMainScreen = "\x1b[?1049l"
	ansiHideCursor = "\x1b[?25l"
	ansiShowCursor = "\x1b[?25h"
	ansiHome       = "\x1b[H"
	ansiClearLine  = "\x1b[K" // to the end of the line
	ansiClearBelow = "\x1b[J" // to the end of the screen
)

func newTopCmd(g *globals) *cobra.Command {
	var (
		interval time.Duration
		once     bool
	)
	cmd := &cobra.Command{
		Use:   "top [--interval 1s] [--once]",
		Short: "Watch tiers, clients and operation rates, refreshing in place",
		Long: `top shows the daemon's tiers (capacity, use, allocations, frees and data-plane
operations per second), its clients (the memory each holds, its lease) and,
in a cluster, the nodes. On a terminal it redraws in place every --interval
until Ctrl-C; otherwise it prints one snapshot per interval.

Rates are measured between two samples, so the first view shows none and
--once waits one interval before printing. Data-plane rates count the
one-sided operations this daemon serves (rdma segments homed here): loads
and stores to mapped memory (local, cxl) never reach the daemon.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 10*time.Millisecond {
				return fmt.Errorf("--interval %s: use 10ms or more", interval)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			t := &top{g: g, interval: interval}
			if once {
				return t.once(ctx)
			}
			return t.run(ctx)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between refreshes, and over which rates are measured")
	cmd.Flags().BoolVar(&once, "once", false, "print one snapshot (after one interval, to measure rates) and exit")
	return cmd
}

// top samples a daemon and shows what changed between samples.
type top struct {
	g        *globals
	interval time.Duration
	prev     *topSample
}

// topSample is what one refresh asks the daemon.
type topSample struct {
	at    time.Time
	st    *poolv1.StatusResponse
	nodes []*poolv1.NodeInfo
}

func (t *top) sample() (*topSample, error) {
	s := &topSample{}
	err := t.g.call(func(ctx context.Context, c poolv1.PoolClient) error {
		st, err := c.Status(ctx, &poolv1.StatusRequest{})
		if err != nil {
			return err
		}
		nodes, err := c.Nodes(ctx, &poolv1.NodesRequest{})
		if err != nil {
			return err
		}
		s.at, s.st, s.nodes = time.Now(), st, nodes.Nodes
		return nil
	})
	return s, err
}

// next samples and returns the view of what changed since the last sample.
func (t *top) next() (*topView, error) {
	cur, err := t.sample()
	if err != nil {
		return nil, err
	}
	v := newTopView(t.prev, cur, t.interval)
	t.prev = cur
	return v, nil
}

// sleep waits one interval; false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func (t *top) once(ctx context.Context) error {
	if _, err := t.next(); err != nil {
		return err
	}
	if !sleep(ctx, t.interval) {
		return ctx.Err()
	}
	v, err := t.next()
	if err != nil {
		return err
	}
	return t.print(v)
}

func (t *top) print(v *topView) error {
	if t.g.output == "json" {
		return t.g.printJSON(v)
	}
	_, err := t.g.out.Write(v.render(0))
	return err
}

// run refreshes until ctx ends: in place on a terminal, else one snapshot
// per interval separated by a blank line.
func (t *top) run(ctx context.Context) error {
	term, rows := terminal(t.g.out)
	if !term || t.g.output == "json" {
		for first := true; ; first = false {
			v, err := t.next()
			if err != nil {
				return err
			}
			if !first && t.g.output != "json" {
				fmt.Fprintln(t.g.out)
			}
			if err := t.print(v); err != nil {
				return err
			}
			if !sleep(ctx, t.interval) {
				return nil
			}
		}
	}
	// The first sample decides whether there is a daemon to watch at all:
	// a wrong --socket is an error, not an empty screen.
	v, err := t.next()
	if err != nil {
		return err
	}
	io.WriteString(t.g.out, ansiAltScreen+ansiHideCursor)
	defer io.WriteString(t.g.out, ansiShowCursor+ansiMainScreen)
	for {
		var frame []byte
		if err != nil {
			// Keep watching: a restarting daemon comes back. Say why the
			// view stopped, and stop only when the user does.
			frame = []byte(fmt.Sprintf("memctl top — %s\n\n%s\n\nretrying every %s; Ctrl-C to quit\n",
				time.Now().Format("15:04:05"), err, t.interval))
			t.prev = nil
		} else {
			_, rows = terminal(t.g.out) // the window may have been resized
			frame = v.render(rows)
		}
		if _, err := t.g.out.Write(inPlace(frame, rows)); err != nil {
			return err
		}
		if !sleep(ctx, t.interval) {
			return nil
		}
		v, err = t.next()
	}
}

// inPlace turns a frame into a redraw over the previous one without
// clearing the screen first (no flicker): home, each line cleared to its
// end, and what is left of the old frame below cleared. With rows > 0 the
// frame is cut to the screen's height and its last line has no newline, so
// the screen never scrolls (which would break the next redraw).
func inPlace(frame []byte, rows int) []byte {
	lines := strings.Split(strings.TrimSuffix(string(frame), "\n"), "\n")
	if rows > 0 && len(lines) > rows {
		lines = lines[:rows]
	}
	var b bytes.Buffer
	b.WriteString(ansiHome)
	for i, l := range lines {
		if i > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString(l)
		b.WriteString(ansiClearLine)
	}
	b.WriteString(ansiClearBelow)
	return b.Bytes()
}

// terminal reports whether w is a terminal, and its height in rows (0 when
// unknown).
func terminal(w io.Writer) (bool, int) {
	f, ok := w.(*os.File)
	if !ok {
		return false, 0
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false, 0
	}
	rows, ok := terminalRows(f)
	if !ok {
		// A character device that is no terminal (/dev/null): no redraws.
		return false, 0
	}
	return true, rows
}
