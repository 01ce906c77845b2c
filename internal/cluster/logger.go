package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"

	"github.com/farmem/farmem/internal/logsample"
)

// memberlistLogger returns a *log.Logger for memberlist that forwards its
// lines to l at the level memberlist wrote in its prefix ("[DEBUG]",
// "[INFO]", "[WARN]", "[ERR]"), sampled: anyone who reaches the gossip
// port makes memberlist log a line per packet it cannot open or decode,
// so at most one line of a kind (lineKind) is forwarded per
// logsample.Interval, with the number held back since the last one
// (suppressed_since_last). It calls onDrop (unless nil) for each gossip
// message memberlist dropped because its handler queue was full, sampled
// or not: memberlist reports those only in its log. onDrop must not block.
func memberlistLogger(l *slog.Logger, onDrop func()) *log.Logger {
	return log.New(&slogWriter{l: l, onDrop: onDrop}, "", 0)
}

// slogWriter is memberlistLogger's writer. Safe for concurrent use.
type slogWriter struct {
	l      *slog.Logger
	onDrop func()
	sample logsample.Sampler[string] // by lineKind
}

// handoffFull is what memberlist logs when it drops a gossip message
// because its handler queue is full.
var handoffFull = []byte("handler queue full")

var levelPrefixes = []struct {
	prefix string
	level  slog.Level
}{
	{"[DEBUG] ", slog.LevelDebug},
	{"[INFO] ", slog.LevelInfo},
	{"[WARN] ", slog.LevelWarn},
	{"[ERR] ", slog.LevelError},
	{"[ERROR] ", slog.LevelError},
}

func (w *slogWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.onDrop != nil && bytes.Contains(p, handoffFull) {
		w.onDrop()
	}
	line, level := parseLogLine(p)
	if !w.l.Enabled(context.Background(), level) {
		return n, nil
	}
	held, ok := w.sample.Take(lineKind(line))
	if !ok {
		return n, nil
	}
	args := []any{"component", "memberlist"}
	if held > 0 {
		args = append(args, "suppressed_since_last", held)
	}
	w.l.Log(context.Background(), level, line, args...)
	return n, nil
}

// maxKind bounds the bytes of a line's kind.
const maxKind = 48

// lineKind is what a memberlist line says without the particulars that
// follow its first ':', '(', quote or " from=" (an error, a count, a
// quoted name or label the packet carried, the sender's address):
// "Decrypt packet failed" for every packet no key opens, from whichever
// address. At most maxKind bytes.
func lineKind(line string) string {
	if i := strings.IndexAny(line, ":(\"'"); i >= 0 {
		line = line[:i]
	}
	if i := strings.Index(line, " from="); i >= 0 {
		line = line[:i]
	}
	if len(line) > maxKind {
		line = line[:maxKind]
	}
	return line
}

// parseLogLine splits memberlist's "[LEVEL] memberlist: message\n" into the
// message and its level; lines without a known prefix are Info.
func parseLogLine(p []byte) (string, slog.Level) {
	p = bytes.TrimRight(p, "\n")
	level := slog.LevelInfo
	for _, lp := range levelPrefixes {
		if bytes.HasPrefix(p, []byte(lp.prefix)) {
			p, level = p[len(lp.prefix):], lp.level
			break
		}
	}
	p = bytes.TrimPrefix(p, []byte("memberlist: "))
	return string(p), level
}
