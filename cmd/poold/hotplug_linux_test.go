package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/testfs"
	"github.com/farmem/farmem/internal/uevent"
)

// injectInto has the kernel broadcast ev to the uevent listeners of
// process pid's network namespace, from a thread moved there (which then
// exits with its goroutine).
func injectInto(pid int, ev uevent.Event) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter poold's network namespace: %w", err)
			return
		}
		errc <- uevent.Inject(ev.Bytes())
	}()
	return <-errc
}

// TestHotplugNetlink runs the poold binary in a network namespace of its
// own (so the synthetic events reach no udev and no other listener) on a
// sysfs tree without CXL memory, then makes the tree show a devdax device
// and has the kernel announce it on the real NETLINK_KOBJECT_UEVENT
// socket: poold places on it; then the device goes, announced the same
// way, and poold stops listing it.
func TestHotplugNetlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace for poold, and CAP_SYS_ADMIN to have the kernel send a synthetic event")
	}
	dir := shortDir(t)
	devRoot := t.TempDir()
	testfs.DevdaxStandIns(t, "../../cxl/testdata/devdax", devRoot)
	sys := testfs.NewSysfsSwitch(t, "plain")
	d := startDaemonVia(t, []string{"unshare", "--net", "--"}, dir+"/data", dir+"/p.sock",
		"--sysfs-root", sys.Root(), "--dev-root", devRoot, "--allow-devdax-fd")
	c, err := alloc.Dial(t.Context(), d.socket)
	require.NoError(t, err)
	defer c.Close()
	devices := func() []string {
		tiers, err := c.Tiers(t.Context())
		require.NoError(t, err)
		for _, ti := range tiers {
			if ti.Tier == alloc.TierCXL {
				return ti.Devices
			}
		}
		return nil
	}
	require.Equal(t, []string{"emulated0"}, devices())

	dax := uevent.Event{Action: "add", DevPath: "/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0", Subsystem: "dax"}
	sys.Set("devdax")
	sent := time.Now()
	err = injectInto(d.cmd.Process.Pid, dax)
	if err != nil && (os.IsNotExist(err) || errorsIsAny(err, unix.EINVAL, unix.EOPNOTSUPP, unix.ECONNREFUSED)) {
		t.Skipf("this kernel does not take injected uevents (Linux 4.18 or later does): %v", err)
	}
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(devices()) == 2 }, 10*time.Second, 10*time.Millisecond, "poold log:\n%s", d.log)
	t.Logf("dax0.0 listed %v after its event", time.Since(sent).Round(time.Millisecond))
	seg, err := c.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	require.Equal(t, "dax0.0", seg.Device())

	sys.Set("plain")
	dax.Action = "remove"
	require.NoError(t, injectInto(d.cmd.Process.Pid, dax))
	require.Eventually(t, func() bool {
		_, err := seg.ReadAt(make([]byte, 8), 0)
		return err != nil
	}, 10*time.Second, 10*time.Millisecond)
	_, err = seg.ReadAt(make([]byte, 8), 0)
	require.ErrorIs(t, err, alloc.ErrSegmentLost)
	require.Equal(t, []string{"emulated0"}, devices())
	require.Contains(t, d.log.String(), "device went away")
}

// errorsIsAny reports whether err matches one of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
