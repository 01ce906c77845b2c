package pool

import (
	"errors"

	"github.com/farmem/farmem/internal/errs"
)

// refused logs and counts a control-plane request that was denied access
// to a segment: one "access refused" line with the keys op, segment, name,
// client, pid and err. Other errors (and nil) pass by silently; op is free,
// attach, stat or descriptor.
func (d *Daemon) refused(op string, c caller, id uint64, name string, err error) {
	if !errors.Is(err, errs.ErrAccessDenied) {
		return
	}
	d.metrics.refused(op)
	var pid int64
	if c.client != nil {
		pid = c.client.pid
	}
	d.log.Warn("access refused", "op", op, "segment", id, "name", name, "client", c.id(), "identity", c.ident, "pid", pid, "err", err)
}

// descriptorRefused reports a descriptor request that failed: an access
// refusal as refused does, any other failure (no such segment, lost, rdma
// tier) as "descriptor refused" at Info.
func (d *Daemon) descriptorRefused(c caller, id uint64, err error) {
	if errors.Is(err, errs.ErrAccessDenied) {
		d.refused("descriptor", c, id, "", err)
		return
	}
	d.log.Info("descriptor refused", "segment", id, "client", c.id(), "err", err)
}
