package pool

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/size"
)

// fsSpace is what statfs says about the filesystem holding a path.
type fsSpace struct {
	total int64     // bytes in the filesystem
	avail int64     // bytes an unprivileged writer may still use
	fsid  unix.Fsid // which filesystem it is
}

// statSpace returns the space of the filesystem holding path. A
// filesystem that reports no block counts (some pseudo filesystems, an
// unlimited hugetlbfs) reports ok false.
func statSpace(path string) (sp fsSpace, ok bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsSpace{}, false, fmt.Errorf("statfs %s: %w", path, err)
	}
	if st.Blocks == 0 {
		return fsSpace{}, false, nil
	}
	bs := int64(st.Bsize)
	return fsSpace{total: int64(st.Blocks) * bs, avail: int64(st.Bavail) * bs, fsid: st.Fsid}, true, nil
}

// String says the space for people: "1.2 MiB available of 2.0 MiB".
func (sp fsSpace) String() string {
	return size.Size(sp.avail).Human() + " available of " + size.Size(sp.total).Human()
}
