//go:build !linux

package testcluster

import (
	"os/exec"
	"testing"
)

func newCluster(t testing.TB, _ config) *Cluster {
	t.Helper()
	t.Skip("needs Linux: network namespaces")
	return nil
}

// Cleanup needs Linux; elsewhere it returns ErrNotSupported.
func Cleanup(prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	return ErrNotSupported
}

func (h *Host) setLink(string) error                 { return ErrNotSupported }
func (h *Host) do(func() error) error                { return ErrNotSupported }
func (h *Host) startCmd(*exec.Cmd) (*Process, error) { return nil, ErrNotSupported }
func (p *Process) kill9() error                      { return ErrNotSupported }
