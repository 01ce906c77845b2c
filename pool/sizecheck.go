package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/size"
)

// budget adds up the sizes the configuration puts on each filesystem (the
// emulated CXL device and the rdma tier's memory often share /dev/shm) and
// on RAM, so that a size the host cannot back is refused at start instead
// of failing the first large Alloc. Not safe for concurrent use.
type budget struct {
	log  *slog.Logger
	byFS map[unix.Fsid]*claims
	ram  claims
}

// claims are the sizes configured on one filesystem, or on RAM.
type claims struct {
	bytes int64
	flags []string // "--emulate-cxl 8MiB", for messages
}

func newBudget(log *slog.Logger) *budget {
	return &budget{log: log, byFS: map[unix.Fsid]*claims{}}
}

// add notes sz bytes for flag and returns the sum so far with every flag's text.
func (c *claims) add(flag string, sz int64) (int64, string) {
	c.bytes += sz
	c.flags = append(c.flags, fmt.Sprintf("--%s %s", flag, size.Size(sz)))
	return c.bytes, strings.Join(c.flags, " and ")
}

// claimDir checks that the filesystem holding dir (or its nearest existing
// parent) can hold sz more bytes for flag, with the other sizes already on
// it. It refuses a sum above the filesystem's size, naming the flags,
// the filesystem and its free space and what to change (dirFlag moves
// it); a sum above what is available, but within the size, is a warning:
// the space may come back, and an Alloc that finds it short fails with
// ErrNoCapacity.
func (b *budget) claimDir(flag string, sz int64, dir, dirFlag string) error {
	sp, ok, err := statSpace(existingParent(dir))
	if err != nil || !ok {
		return nil // no limit to check against (statfs fails, or hugetlbfs without size=)
	}
	c := b.byFS[sp.fsid]
	if c == nil {
		c = &claims{}
		b.byFS[sp.fsid] = c
	}
	sum, flags := c.add(flag, sz)
	switch {
	case sum > sp.total:
		return fmt.Errorf("%w: %s: %s in all, more than the filesystem holding %s (%s) can ever hold; lower --%s or point --%s at a larger filesystem",
			ErrConfig, flags, size.Size(sum).Human(), dir, sp, flag, dirFlag)
	case sum > sp.avail+usedIn(dir):
		b.log.Warn(fmt.Sprintf("%s: %s in all, more than the filesystem holding %s has available now (%s); allocations fail with no capacity when it runs short: free space there, lower --%s, or point --%s at a larger filesystem",
			flags, size.Size(sum).Human(), dir, sp, flag, dirFlag))
	}
	return nil
}

// claimRAM checks sz bytes of memfd memory for flag against the host's RAM:
// refused above its total, a warning above what is free now.
func (b *budget) claimRAM(flag string, sz int64) error {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return nil
	}
	unit := int64(si.Unit)
	total, free := int64(si.Totalram)*unit, int64(si.Freeram+si.Bufferram)*unit
	sum, flags := b.ram.add(flag, sz)
	switch {
	case sum > total:
		return fmt.Errorf("%w: %s: %s in all, more than this host's RAM (%s); lower --%s", ErrConfig, flags, size.Size(sum).Human(), size.Size(total).Human(), flag)
	case sum > free:
		b.log.Warn(fmt.Sprintf("%s: %s in all, more than this host's free RAM now (%s of %s); allocations fail with no capacity when it runs short: lower --%s",
			flags, size.Size(sum).Human(), size.Size(free).Human(), size.Size(total).Human(), flag))
	}
	return nil
}

// existingParent is dir or its nearest parent that exists.
func existingParent(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return dir
		}
		dir = up
	}
}

// usedIn is the space the files directly in dir take: segment files a
// previous run left, which count as used on the filesystem but are part of
// the device's capacity.
func usedIn(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
	}
	return n
}
