package pool

import (
	"errors"
	"log/slog"

	"github.com/farmem/farmem/internal/errs"
)

// refused logs and counts a control-plane request that was denied access
// to a segment: one "access refused" line with the keys op, segment, name,
// client, pid and err, sampled (logRefused). Other errors (and nil) pass
// by silently; op names the call (free, attach, stat, descriptor, move,
// authorize, delegate, replicate, home-failed, move-out, write-lost-shard),
// the label farmem_access_denied_total counts it under.
func (d *Daemon) refused(op string, c caller, id uint64, name string, err error) {
	if !errors.Is(err, errs.ErrAccessDenied) {
		return
	}
	d.metrics.refused(op)
	var pid int64
	if c.client != nil {
		pid = c.client.pid
	}
	d.logRefused(slog.LevelWarn, "access refused", op, c.ident, "op", op, "segment", id, "name", name, "client", c.id(), "identity", c.ident, "pid", pid, "err", err)
}

// descriptorRefused reports a descriptor request that failed: an access
// refusal as refused does, any other failure (no such segment, lost, rdma
// tier) as "descriptor refused" at Info, sampled the same way.
func (d *Daemon) descriptorRefused(c caller, id uint64, err error) {
	if errors.Is(err, errs.ErrAccessDenied) {
		d.refused("descriptor", c, id, "", err)
		return
	}
	d.logRefused(slog.LevelInfo, "descriptor refused", "descriptor", c.ident, "segment", id, "client", c.id(), "err", err)
}

// refusalKey keys the sampled lines about refused requests: the message,
// the operation and the identity the transport proved (not the client id,
// which the caller picks), so that a caller refused at will hides neither
// other lines nor other callers'.
type refusalKey struct{ msg, op, ident string }

// logRefused logs msg about a request of op refused to ident, at most once
// per logsample.Interval per message, operation and identity, with the
// number held back since the last one (suppressed_since_last): a client
// can be refused as fast as it can ask, and the metrics count every one.
func (d *Daemon) logRefused(level slog.Level, msg, op, ident string, args ...any) {
	d.refusalLog.Log(d.log, level, refusalKey{msg, op, ident}, msg, args...)
}
