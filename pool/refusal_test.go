package pool

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/logsample"
)

// TestRefusalLogSampled: a client refused at will (1,000 Frees of another
// client's segment, 1,000 sessions asking for a client id reserved
// for a peer's daemon) gets one "access refused" line of each within one
// logsample.Interval, while farmem_access_denied_total counts every
// refusal; the next line of each, an Interval later, says how many were
// held back.
func TestRefusalLogSampled(t *testing.T) {
	var logs logBuffer
	d, err := Start(testConfig(t), slog.New(slog.NewJSONHandler(&logs, nil)))
	require.NoError(t, err)
	defer d.Close()
	t0 := time.Unix(1000, 0)
	d.refusalLog.SetClock(func() time.Time { return t0 })
	ctx := t.Context()
	owner, err := alloc.Dial(ctx, d.cfg.Socket, alloc.WithClientID("owner"))
	require.NoError(t, err)
	defer owner.Close()
	owned, err := owner.Alloc(ctx, 4096, alloc.WithTier(alloc.TierLocal))
	require.NoError(t, err)
	intruder, err := alloc.Dial(ctx, d.cfg.Socket, alloc.WithClientID("intruder"))
	require.NoError(t, err)
	defer intruder.Close()

	const n = 1000
	free := func() { require.ErrorIs(t, intruder.FreeByID(ctx, owned.ID()), alloc.ErrAccessDenied) }
	session := func() { require.ErrorIs(t, d.bindSession("poold/b", caller{ident: "uid:4242"}), errs.ErrAccessDenied) }
	for range n {
		free()
		session()
	}
	lines := func(op string) int {
		k := 0
		for _, ev := range logs.events(t) {
			if ev["msg"] == "access refused" && ev["op"] == op {
				k++
			}
		}
		return k
	}
	t.Logf("%d refused frees: %d lines; %d refused sessions: %d lines", n, lines("free"), n, lines("session"))
	require.Equal(t, 1, lines("free"))
	require.Equal(t, 1, lines("session"))
	require.Equal(t, float64(n), refusalCount(t, d, "free"))
	require.Equal(t, float64(n), refusalCount(t, d, "session"))

	d.refusalLog.SetClock(func() time.Time { return t0.Add(logsample.Interval) })
	free()
	session()
	for _, op := range []string{"free", "session"} {
		require.NotNil(t, logs.find(t, "access refused", map[string]any{"op": op, "suppressed_since_last": n - 1}), op)
	}
}

// refusalCount is farmem_access_denied_total{op}.
func refusalCount(t *testing.T, d *Daemon, op string) float64 {
	t.Helper()
	fams, err := d.metrics.reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "farmem_access_denied_total" {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestMoveSourceIDReserved: no session may take the client id of a move's
// source (move-from-NODE): the daemon delegates credentials for it at
// move targets, and a client bound to it would have them delegated for its
// own identity instead, which withdraws the source's and cuts its pushes.
func TestMoveSourceIDReserved(t *testing.T) {
	d, err := Start(testConfig(t), nil)
	require.NoError(t, err)
	defer d.Close()
	require.ErrorIs(t, d.bindSession(moveSourceClient("b"), caller{ident: "uid:1000"}), errs.ErrInvalid)
	_, err = alloc.Dial(t.Context(), d.cfg.Socket, alloc.WithClientID(moveSourceClient("b")))
	require.ErrorIs(t, err, alloc.ErrInvalid)
	require.Contains(t, err.Error(), "name the sources of moves")
}
