package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/logsample"
	"github.com/farmem/farmem/internal/syncbuf"
)

// TestMemberlistLogSampled: 1,000 packets no gossip key opens, from as many
// addresses, make memberlist log 1,000 lines (its format, in
// memberlist's net.go, ingestPacket: "[ERR] memberlist: Decrypt packet
// failed: %v %s");
// within one logsample.Interval one of them is logged, and a line of
// another kind still is; the next one, an Interval later, says how many
// were held back. Every handler-queue drop is counted, sampled or not.
func TestMemberlistLogSampled(t *testing.T) {
	var logs syncbuf.Buffer
	var drops int
	l := memberlistLogger(slog.New(slog.NewTextHandler(&logs, nil)), func() { drops++ })
	w := l.Writer().(*slogWriter)
	t0 := time.Unix(1000, 0)
	w.sample.SetClock(func() time.Time { return t0 })
	undecryptable := func(i int) {
		l.Printf("[ERR] memberlist: Decrypt packet failed: %v %s", errors.New("cipher: message authentication failed"), fmt.Sprintf("from=10.0.%d.%d:7946", i/250, i%250))
	}
	for i := range 1000 {
		undecryptable(i)
		l.Printf("[WARN] memberlist: handler queue full, dropping message (%d) %s", 8, "from=10.0.0.7:7946")
	}
	l.Printf("[WARN] memberlist: Got invalid checksum for UDP packet: %x, %x", 1, 2)
	require.Equal(t, 1, strings.Count(logs.String(), "Decrypt packet failed"), logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "handler queue full"))
	require.Equal(t, 1000, drops, "every drop is counted")
	require.Contains(t, logs.String(), "Got invalid checksum", "other kinds have their own budget")

	w.sample.SetClock(func() time.Time { return t0.Add(logsample.Interval) })
	undecryptable(1000)
	require.Equal(t, 2, strings.Count(logs.String(), "Decrypt packet failed"))
	require.Contains(t, logs.String(), "suppressed_since_last=999")
}

func TestLineKind(t *testing.T) {
	for line, kind := range map[string]string{
		"Decrypt packet failed: cipher: message authentication failed from=10.0.0.1:7946": "Decrypt packet failed",
		"Received invalid msgType (77) from=10.0.0.1:7946":                                "Received invalid msgType ",
		"missing message type byte from=10.0.0.1:7946":                                    "missing message type byte",
		`discarding packet with unacceptable label "\x86\xb0RR": from=10.0.0.1:7946`:      "discarding packet with unacceptable label ",
		"Got ping for unexpected node 'x' from=10.0.0.1:7946":                             "Got ping for unexpected node ",
		"Suspect b has failed, no acks received":                                          "Suspect b has failed, no acks received",
		strings.Repeat("x", 100):                                                          strings.Repeat("x", maxKind),
	} {
		require.Equal(t, kind, lineKind(line), line)
	}
}
