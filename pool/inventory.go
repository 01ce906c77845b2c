package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/cxl"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/extent"
	"github.com/farmem/farmem/internal/paths"
	"github.com/farmem/farmem/internal/size"
)

// sizeSetting names the setting that sizes each device poold makes itself
// (by the device's name), for errors about its size.
var sizeSetting = map[string]string{"emulated0": "emulate-cxl", "export0": "export-size", "dram": "local-size"}

// discover reads the kernel's view of CXL memory and opens a device for
// each usable piece, then the emulated and local devices the configuration
// asks for. A device that cannot be opened is logged and skipped, never
// fatal: the daemon still serves what it has.
func discover(cfg Config, log *slog.Logger) (*cxl.Inventory, []*dev, error) {
	inv := &cxl.Inventory{}
	if fs, err := cxl.NewFS(cfg.SysfsRoot); err != nil {
		log.Warn("no sysfs to discover CXL memory from; using emulation", "sysfs", cfg.SysfsRoot, "err", err)
	} else if inv, err = fs.Discover(); err != nil {
		log.Warn("CXL discovery failed; using emulation", "sysfs", cfg.SysfsRoot, "err", err)
		inv = &cxl.Inventory{}
	}
	for _, p := range inv.Problems {
		log.Debug("sysfs problem", "err", p)
	}
	var devs []*dev
	fail := func(err error) (*cxl.Inventory, []*dev, error) {
		for _, d := range devs {
			d.Close()
		}
		return nil, nil, err
	}
	add := func(d device.Device, tier poolv1.Tier, usable bool, note string) error {
		ext, err := extent.New(d.Capacity(), d.Align())
		if err != nil {
			d.Close()
			if setting, ok := sizeSetting[d.Name()]; ok && d.Capacity() < d.Align() {
				return fmt.Errorf("%w: %s %d is %s, less than one page of its memory (%s); write a size like 1GiB, or 0 to turn it off",
					ErrConfig, setting, d.Capacity(), size.Size(d.Capacity()).Human(), size.Size(d.Align()).Human())
			}
			return fmt.Errorf("device %s: %w", d.Name(), err)
		}
		devs = append(devs, &dev{Device: d, tier: tier, ext: ext, usable: usable, note: note})
		return nil
	}
	for _, dx := range inv.DevdaxDevices() {
		d, err := openDevdax(cfg, dx, log)
		if err != nil {
			continue
		}
		if err := add(d, poolv1.Tier_TIER_CXL, cfg.AllowDevdaxFD, devdaxNote(cfg, dx.Name)); err != nil {
			return fail(err)
		}
		devs[len(devs)-1].powerSafe = dx.Persistent
	}
	for _, n := range inv.FarNodes() {
		d, err := openNUMA(cfg, n, log)
		if err != nil {
			continue
		}
		if err := add(d, poolv1.Tier_TIER_CXL, true, ""); err != nil {
			return fail(err)
		}
	}
	foundCXL := len(devs) > 0
	sizes := newBudget(log)
	if cfg.EmulateCXL > 0 && (!foundCXL || cfg.ForceEmulate) {
		dir := cfg.emulateDir()
		if err := sizes.claimDir("emulate-cxl", int64(cfg.EmulateCXL), dir, "emulate-dir"); err != nil {
			return fail(err)
		}
		d, err := device.NewEmulated("emulated0", dir, int64(cfg.EmulateCXL))
		if err != nil {
			return fail(fmt.Errorf("emulated CXL device in %s: %w (choose another directory with --emulate-dir, or --emulate-cxl 0)", dir, err))
		}
		if err := add(d, poolv1.Tier_TIER_CXL, true, emulatedNote(dir, foundCXL)); err != nil {
			return fail(err)
		}
		// Files on a disk filesystem outlive a reboot: their records must too.
		devs[len(devs)-1].powerSafe = d.SurvivesReboot()
		log.Info("using an emulated CXL device", "dir", dir, "capacity", int64(cfg.EmulateCXL), "reason", map[bool]string{false: "no CXL memory found", true: "--force-emulate"}[foundCXL])
	}
	if cfg.LocalSize > 0 {
		if err := sizes.claimRAM("local-size", int64(cfg.LocalSize)); err != nil {
			return fail(err)
		}
		d, err := device.NewDRAM(int64(cfg.LocalSize))
		if err != nil {
			return fail(fmt.Errorf("local DRAM tier: %w", err))
		}
		if err := add(d, poolv1.Tier_TIER_LOCAL, true, "local DRAM (memfd); contents do not survive a daemon restart"); err != nil {
			return fail(err)
		}
	}
	if cfg.ExportSize > 0 && cfg.DataListen != "" {
		dir := filepath.Join(cfg.shmDir(), "export")
		if err := sizes.claimDir("export-size", int64(cfg.ExportSize), dir, "shm-dir"); err != nil {
			return fail(err)
		}
		d, err := device.NewEmulated("export0", dir, int64(cfg.ExportSize))
		if err != nil {
			return fail(fmt.Errorf("rdma tier memory in %s: %w (or disable it with --export-size 0)", dir, err))
		}
		if err := add(d, poolv1.Tier_TIER_RDMA, true, ""); err != nil {
			return fail(err)
		}
		devs[len(devs)-1].kind, devs[len(devs)-1].emulated = "loopback", true
	}
	if len(devs) == 0 {
		return fail(errors.New("no memory to serve: no CXL memory found, emulation and the local tier are disabled; set --emulate-cxl or --local-size"))
	}
	// Name this data directory in the shared-memory directory, so that one
	// left behind by a pool whose data directory is gone can be found and
	// removed (memctl doctor).
	if shm := cfg.shmDir(); shm != cfg.DataDir {
		if _, err := os.Stat(shm); err == nil {
			if err := paths.WriteShmOwner(shm, cfg.DataDir); err != nil {
				log.Warn("record the data directory in the shared-memory directory", "err", err)
			}
		}
	}
	return inv, devs, nil
}

// openDevdax opens a devdax device discovery found, logging why when it
// cannot be used.
func openDevdax(cfg Config, dx cxl.DaxDevice, log *slog.Logger) (*device.Devdax, error) {
	path, align := devPath(cfg, dx), devdaxAlign(dx)
	d, err := device.NewDevdax(dx.Name, path, int64(dx.Size), align, dx.TargetNode)
	if err != nil {
		log.Warn("devdax device found but not usable", "device", dx.Name, "path", path, "err", err)
		return nil, err
	}
	log.Info("using CXL devdax device", "device", dx.Name, "size", dx.Size, "align", align, "region", dx.Region, "node", dx.TargetNode, "handed-out", cfg.AllowDevdaxFD, "persistent", dx.Persistent)
	return d, nil
}

// devdaxNote says why a devdax device is not handed out, "" when it is.
func devdaxNote(cfg Config, name string) string {
	if cfg.AllowDevdaxFD {
		return ""
	}
	return fmt.Sprintf("%s is devdax: one descriptor reaches every segment on it, so it is not handed to clients; start poold with --allow-devdax-fd to use it", name)
}

// openNUMA opens the device of a memory-only NUMA node discovery found,
// logging why when it cannot be used.
func openNUMA(cfg Config, n cxl.Node, log *slog.Logger) (*device.NUMA, error) {
	capacity := int64(n.MemFree) &^ (1<<21 - 1)
	d, err := device.NewNUMA(n.ID, filepath.Join(cfg.numaDir(), fmt.Sprintf("node%d", n.ID)), capacity)
	if err != nil {
		log.Warn("memory-only NUMA node found but not usable", "node", n.ID, "err", err)
		return nil, err
	}
	log.Info("using memory-only NUMA node", "node", n.ID, "capacity", capacity)
	return d, nil
}

// emulatedNote says what the emulated device is, beside real CXL memory
// or not.
func emulatedNote(dir string, foundCXL bool) string {
	if foundCXL {
		return fmt.Sprintf("emulated beside real CXL memory: files in %s, ordinary DRAM", dir)
	}
	return fmt.Sprintf("emulated: no CXL memory found, so files in %s stand in for it; this is ordinary DRAM, not CXL", dir)
}
