package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// terminalRows returns the height of the terminal f is, and false when f is
// no terminal.
func terminalRows(f *os.File) (int, bool) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, false
	}
	return int(ws.Row), true
}
