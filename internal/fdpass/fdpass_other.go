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

// Get needs Linux.
func (*Conn) Get(Request, time.Time) (Response, error) { return Response{}, errs.ErrNotSupported }

// Close does nothing.
func (*Conn) Close() error { return nil }

// WriteResponse needs Linux.
func WriteResponse(*net.UnixConn, error, *os.File, int64, int64) error { return errs.ErrNotSupported }
