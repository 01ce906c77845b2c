package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"sync/atomic"
)

// memberlistLogger returns a *log.Logger for memberlist that forwards each
// line to l at the level memberlist wrote in its prefix ("[DEBUG]", "[INFO]",
// "[WARN]", "[ERR]"). It counts in handoffDrops (which may be nil) the
// gossip messages memberlist dropped because its handler queue was full:
// memberlist reports those only in its log.
func memberlistLogger(l *slog.Logger, handoffDrops *atomic.Uint64) *log.Logger {
	return log.New(slogWriter{l, handoffDrops}, "", 0)
}

type slogWriter struct {
	l            *slog.Logger
	handoffDrops *atomic.Uint64
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

func (w slogWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.handoffDrops != nil && bytes.Contains(p, handoffFull) {
		w.handoffDrops.Add(1)
	}
	line, level := parseLogLine(p)
	if w.l.Enabled(context.Background(), level) {
		w.l.Log(context.Background(), level, line, "component", "memberlist")
	}
	return n, nil
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
