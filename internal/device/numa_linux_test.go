//go:build linux

package device

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestNewNUMABadInput(t *testing.T) {
	shm := shmDir(t)
	missing := -1
	for n := 1; n < maxNode; n++ {
		if _, err := os.Stat(fmt.Sprintf("/sys/devices/system/node/node%d", n)); os.IsNotExist(err) {
			missing = n
			break
		}
	}
	cases := []struct {
		name     string
		node     int
		dir      string
		capacity int64
	}{
		{"negative node", -1, shm, 1 << 20},
		{"node too large", maxNode, shm, 1 << 20},
		{"non-existent node", missing, shm, 1 << 20},
		{"not tmpfs", 0, t.TempDir(), 1 << 20},
		{"empty dir", 0, "", 1 << 20},
		{"zero capacity", 0, shm, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.node == -1 && tc.name == "non-existent node" {
				t.Skip("every node number is present")
			}
			if tc.name == "not tmpfs" {
				var st unix.Statfs_t
				require.NoError(t, unix.Statfs(tc.dir, &st))
				if uint32(st.Type) == uint32(unix.TMPFS_MAGIC) {
					t.Skip("the temporary directory is on tmpfs")
				}
			}
			d, err := NewNUMA(tc.node, tc.dir, tc.capacity)
			require.ErrorIs(t, err, ErrInvalid)
			require.Nil(t, d)
			t.Log(err)
		})
	}
}

// TestMbindMissingNode binds a mapping to a node that does not exist: the
// error must say so, match ErrInvalid, and leave nothing behind.
func TestMbindMissingNode(t *testing.T) {
	if _, err := os.Stat("/sys/devices/system/node/node1"); err == nil {
		t.Skip("node 1 exists on this machine")
	}
	dir := shmDir(t)
	f, err := os.Create(dir + "/seg")
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	require.NoError(t, f.Truncate(4*pageSize))
	err = bindFile(f, 4*pageSize, 1)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "NUMA node 1")
	require.ErrorContains(t, err, "numactl -H")
}

func TestNUMAPagesOnNode(t *testing.T) {
	dir := shmDir(t)
	d := openDevice(t, func() (Device, error) { return NewNUMA(0, dir, 64<<20) })
	const pages = 256
	b, err := d.Create(1, 0, pages*pageSize)
	require.NoError(t, err)

	// Create allocated the pages on the node, so even a fresh mapping that
	// only maps them (MAP_POPULATE on a shared mapping read-faults) finds
	// them there.
	mem := mapBacking(t, b, MapOptions{Populate: true})
	got, err := PagesOnNode(mem)
	require.NoError(t, err)
	require.Equal(t, map[int]int{0: pages}, got)

	// A sub-slice counts only the pages it spans.
	got, err = PagesOnNode(mem[pageSize+1 : 3*pageSize-1])
	require.NoError(t, err)
	require.Equal(t, map[int]int{0: 2}, got)

	got, err = PagesOnNode(nil)
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestPagesOnNodeNotResident(t *testing.T) {
	d := openDevice(t, func() (Device, error) { return NewDRAM(1 << 20) })
	b, err := d.Create(1, 0, 8*pageSize)
	require.NoError(t, err)
	mem := mapBacking(t, b)
	got, err := PagesOnNode(mem)
	require.NoError(t, err)
	require.Equal(t, map[int]int{NotResident: 8}, got)
	mem[0] = 1
	got, err = PagesOnNode(mem)
	require.NoError(t, err)
	require.Equal(t, map[int]int{NotResident: 7, 0: 1}, got)
}

func TestNUMADirInUse(t *testing.T) {
	dir := shmDir(t)
	d := openDevice(t, func() (Device, error) { return NewNUMA(0, dir, 1<<20) })
	_, err := NewNUMA(0, dir, 1<<20)
	require.ErrorIs(t, err, ErrInUse)
	require.Equal(t, dir, d.(*NUMA).Dir())
}

// TestNUMANoSpace uses a tiny tmpfs. A segment larger than the free space
// fails up front; one that passes that check but cannot be allocated (here:
// a sparse file bound directly, as when other sparse files filled the
// filesystem meanwhile) fails at Create too, never as a fault in a client.
func TestNUMANoSpace(t *testing.T) {
	dir := mountTest(t, "tmpfs", "size=1m")
	d := openDevice(t, func() (Device, error) { return NewNUMA(0, dir+"/node0", 64<<20) })
	b, err := d.Create(1, 0, 512<<10)
	require.NoError(t, err)
	require.NoError(t, b.File.Close())
	_, err = d.Create(2, 0, 768<<10)
	require.ErrorIs(t, err, ErrNoSpace)
	ids, err := d.(*NUMA).Segments()
	require.NoError(t, err)
	require.Equal(t, []uint64{1}, ids, "a failed Create leaves no file")

	f, err := os.Create(dir + "/sparse")
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	require.NoError(t, f.Truncate(1<<20))
	err = bindFile(f, 1<<20, 0)
	require.ErrorIs(t, err, ErrNoSpace)
	t.Log(err)
}
