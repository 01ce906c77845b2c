//go:build !(linux && cgo && verbs)

package verbs

import (
	"context"
	"net"

	"github.com/farmem/farmem/rdma"
)

// errNotBuilt explains what is missing and what to do.
var errNotBuilt = &rdma.NotSupportedError{
	Feature: "verbs transport",
	Reason:  "this binary was built without libibverbs support; rebuild with CGO_ENABLED=1 -tags verbs on Linux with libibverbs-dev installed, or use the tcp transport",
}

// Transport is the verbs transport. In this build it only reports that verbs
// is not supported. It is stateless and safe for concurrent use.
type Transport struct{}

var _ rdma.Transport = Transport{}

// Name returns "verbs".
func (Transport) Name() string { return "verbs" }

// Dial always fails with an error matching rdma.ErrNotSupported in this build.
func (Transport) Dial(context.Context, string, []byte) (rdma.Conn, error) {
	return nil, errNotBuilt
}

// Dial always fails with an error matching rdma.ErrNotSupported in this build.
func Dial(ctx context.Context, addr string, cred []byte) (rdma.Conn, error) {
	return Transport{}.Dial(ctx, addr, cred)
}

// Available always fails with an error matching rdma.ErrNotSupported in
// this build.
func Available() (string, error) { return "", errNotBuilt }

// Server is the verbs exporter. In this build none can be made. Safe for
// concurrent use.
type Server struct{}

var _ rdma.Exporter = (*Server)(nil)

// NewServer always fails with an error matching rdma.ErrNotSupported in this
// build.
func NewServer(Config) (*Server, error) { return nil, errNotBuilt }

// Device returns "".
func (*Server) Device() string { return "" }

// Export fails with an error matching rdma.ErrNotSupported.
func (*Server) Export(uint64, []byte, uint64) (rdma.Key, error) { return rdma.Key{}, errNotBuilt }

// ExportKey fails with an error matching rdma.ErrNotSupported.
func (*Server) ExportKey(uint64, []byte, uint64, rdma.Key) error { return errNotBuilt }

// Revoke fails with an error matching rdma.ErrNotSupported.
func (*Server) Revoke(uint64) error { return errNotBuilt }

// Fence fails with an error matching rdma.ErrNotSupported.
func (*Server) Fence(uint64) error { return errNotBuilt }

// SetEpoch fails with an error matching rdma.ErrNotSupported.
func (*Server) SetEpoch(uint64, uint64) error { return errNotBuilt }

// MarkLost fails with an error matching rdma.ErrNotSupported.
func (*Server) MarkLost(uint64) error { return errNotBuilt }

// Listener returns l unchanged.
func (*Server) Listener(l net.Listener) net.Listener { return l }

// Close does nothing.
func (*Server) Close() error { return nil }
