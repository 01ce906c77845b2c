//go:build !linux

package main

import "os"

// terminalRows cannot ask the terminal's size here: a character device is
// taken for a terminal of unknown height.
func terminalRows(*os.File) (int, bool) { return 0, true }
