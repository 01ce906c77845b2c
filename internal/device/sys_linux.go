//go:build linux

package device

import (
	"errors"
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/mmap"
)

// supported reports whether what can run here: always on Linux.
func supported(what string) error { return nil }

// statFS describes the filesystem holding dir.
func statFS(dir string) (fsInfo, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fsInfo{}, err
	}
	info := fsInfo{kind: fsOther, bsize: int64(st.Bsize), avail: -1}
	switch uint32(st.Type) {
	case uint32(unix.TMPFS_MAGIC):
		info.kind = fsTmpfs
	case uint32(unix.HUGETLBFS_MAGIC):
		info.kind = fsHugetlbfs
	}
	// tmpfs and hugetlbfs mounted without a size limit report 0 blocks.
	if st.Blocks != 0 && info.bsize > 0 {
		if st.Bavail > uint64(math.MaxInt64/info.bsize) {
			info.avail = math.MaxInt64
		} else {
			info.avail = int64(st.Bavail) * info.bsize
		}
	}
	return info, nil
}

// IsNoSpace reports whether err means the filesystem or a quota is full.
func IsNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.EFBIG)
}

// reserve allocates f's first length bytes (fallocate), so that touching
// them later cannot fail for want of space. A filesystem without fallocate
// leaves the file sparse: not an error.
func reserve(f *os.File, length int64) error {
	return withFd(f, func(fd int) error {
		for {
			err := unix.Fallocate(fd, 0, 0, length)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EOPNOTSUPP:
				return nil
			}
			return err
		}
	})
}

// withFd runs fn with f's descriptor, which stays open meanwhile.
func withFd(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// createMemfd returns a memfd of size bytes (sparse, zero), sealed so that
// no holder of a descriptor can shrink or grow it under others' mappings.
func createMemfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if errors.Is(err, unix.ENOSYS) {
		return nil, &notSupportedError{feature: "memfd_create", reason: "the kernel is older than 3.17"}
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, size); err != nil {
		_ = f.Close()
		if IsNoSpace(err) {
			return nil, fmt.Errorf("size memfd %s to %d bytes: %w: %w", name, size, ErrNoSpace, err)
		}
		return nil, fmt.Errorf("size memfd %s to %d bytes: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seal memfd %s: %w", name, err)
	}
	return f, nil
}

// dupFile returns a new close-on-exec descriptor for f's open file.
func dupFile(f *os.File) (*os.File, error) {
	var nfd int
	err := withFd(f, func(fd int) error {
		var err error
		nfd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dup %s (out of file descriptors? raise ulimit -n): %w", f.Name(), err)
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// lockFile opens (creating) path and takes an exclusive flock on it, held
// until the returned file is closed.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	err = withFd(f, func(fd int) error { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) })
	if err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is locked by another device instance (a second poold on the same directory?); stop it or use another directory: %w",
				path, ErrInUse)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// mmapFile maps length bytes of f from off (page aligned), shared and
// read-write, optionally pre-faulted; a mapping the memory cannot hold is
// ErrNoSpace.
func mmapFile(f *os.File, off, length int64, populate bool) ([]byte, error) {
	b, err := mmap.Shared(f, off, length, populate)
	if errors.Is(err, unix.ENOMEM) {
		return nil, fmt.Errorf("%w: %w (on hugetlbfs: reserve more huge pages with sysctl vm.nr_hugepages)", ErrNoSpace, err)
	}
	return b, err
}
