//go:build !linux

package fdpass

import (
	"net"
	"os"
	"time"

	"github.com/farmem/farmem/internal/errs"
)

// Conn is the client side of a descriptor-passing connection. It is not
// safe for concurrent use.
type Conn struct{}

// Dial needs Linux.
func Dial(string) (*Conn, error) { return nil, errs.ErrNotSupported }

// Do needs Linux.
func (*Conn) Do(Request, time.Time) (Response, error) { return Response{}, errs.ErrNotSupported }

// Close does nothing.
func (*Conn) Close() error { return nil }

// WriteResponse needs Linux.
func WriteResponse(*net.UnixConn, error, *os.File, int64, int64, []byte) error {
	return errs.ErrNotSupported
}
