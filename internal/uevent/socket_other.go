//go:build !linux

package uevent

import (
	"fmt"

	"github.com/farmem/farmem/internal/errs"
)

// Socket is a NETLINK_KOBJECT_UEVENT socket; Linux only.
type Socket struct{}

// Listen fails: uevents are Linux's.
func Listen() (*Socket, error) {
	return nil, fmt.Errorf("uevent: kernel device events are Linux's: %w", errs.ErrNotSupported)
}

// Receive fails: there is no socket.
func (s *Socket) Receive([]byte) (int, error) {
	return 0, fmt.Errorf("uevent: %w", errs.ErrNotSupported)
}

// Close does nothing.
func (s *Socket) Close() error { return nil }

// Inject fails: uevents are Linux's.
func Inject([]byte) error { return fmt.Errorf("uevent: %w", errs.ErrNotSupported) }
