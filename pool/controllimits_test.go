package pool_test

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/pool"
)

// TestControlPlaneLimits: a session's client name is at most MaxNameLen
// bytes (a longer one is refused with ErrInvalid), and the control plane
// tells every connection in its HTTP/2 SETTINGS that it may have at most
// 256 calls open at once.
func TestControlPlaneLimits(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	ctx := t.Context()

	_, err := session.Dial(ctx, "unix", cfg.Socket, session.Options{ClientID: "named", ClientName: strings.Repeat("n", pool.MaxNameLen+1)})
	require.ErrorIs(t, err, errs.ErrInvalid)
	require.ErrorContains(t, err, "client name")
	c, err := session.Dial(ctx, "unix", cfg.Socket, session.Options{ClientID: "named", ClientName: strings.Repeat("n", pool.MaxNameLen)})
	require.NoError(t, err)
	c.Close()

	// The server's first frame after the client's preface is its SETTINGS
	// (RFC 9113 3.4): 9-byte header (length u24, type 4), then 6-byte
	// entries of id u16 and value u32; 3 is MAX_CONCURRENT_STREAMS.
	nc, err := net.Dial("unix", cfg.Socket)
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = nc.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0))
	require.NoError(t, err)
	var hdr [9]byte
	_, err = io.ReadFull(nc, hdr[:])
	require.NoError(t, err)
	require.Equal(t, byte(4), hdr[3], "the server's first frame is SETTINGS")
	body := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
	_, err = io.ReadFull(nc, body)
	require.NoError(t, err)
	streams := -1
	for b := body; len(b) >= 6; b = b[6:] {
		if binary.BigEndian.Uint16(b) == 3 {
			streams = int(binary.BigEndian.Uint32(b[2:]))
		}
	}
	require.Equal(t, 256, streams, "SETTINGS_MAX_CONCURRENT_STREAMS")
}
