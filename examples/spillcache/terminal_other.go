//go:build !linux

package main

import (
	"io"
	"os"
)

// isTerminal reports whether w is a character device, taken for a
// terminal where its attributes are not asked for.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
