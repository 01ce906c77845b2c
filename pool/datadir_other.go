//go:build !linux

package pool

import "os"

// tryLock takes no lock where flock is not wired up; the metadata store's
// own lock still keeps a second daemon out, later in New.
func tryLock(*os.File) (held bool, err error) { return false, nil }
