package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// memberlistLogger returns a *log.Logger for memberlist that forwards each
// line to l at the level memberlist wrote in its prefix ("[DEBUG]", "[INFO]",
// "[WARN]", "[ERR]"). It calls onDrop (unless nil) for each gossip message
// memberlist dropped because its handler queue was full: memberlist
// reports those only in its log. onDrop must not block.
func memberlistLogger(l *slog.Logger, onDrop func()) *log.Logger {
	return log.New(slogWriter{l, onDrop}, "", 0)
}

type slogWriter struct {
	l      *slog.Logger
	onDrop func()
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
	if w.onDrop != nil && bytes.Contains(p, handoffFull) {
		w.onDrop()
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
