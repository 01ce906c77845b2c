package main

import (
	"archive/tar"
	"bytes"
	"flag"

	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// snapshot copies the parts of /sys that farmem's cxl package reads into a
// tar, a fixture tree for cxl/testdata. sysfs cannot be tarred as is: every
// attribute claims 4096 bytes, some are write-only or binary, and reads of
// a few have side effects. So this walks chosen roots itself: readable text
// attributes are copied by content, symlinks are kept as the kernel's
// relative links, the device a bus link points to is copied with its
// subtree, and its ancestors' own attributes (not their subtrees) too.
type snapshot struct {
	root  string // "/sys"
	files map[string][]byte
	links map[string]string
	dirs  map[string]bool
}

// skipName lists attributes never copied: binary or huge (PCI config space,
// label areas), write-only triggers, and the power/ and iommu internals.
var skipName = map[string]bool{
	"config": true, "rom": true, "remove": true, "rescan": true, "reset": true, "bind": true, "unbind": true,
	"new_id": true, "remove_id": true, "uevent": true, "modalias": true, "label_storage_area": true, "cdat": true,
	"delete_region": true, "create_pmem_region": true, "create_ram_region": true, "commit": false,
	"sanitize": true, "secure_erase": true, "trigger_poison_list": true, "clear_poison": true, "inject_poison": true,
	"compact": true, "data": true, "loading": true, "power": true, "msi_irqs": true, "firmware_node": true,
	"iommu": true, "iommu_group": true, "driver_override": true, "broken_parity_status": true,
}

func (s *snapshot) skip(name string) bool {
	return skipName[name] || strings.HasPrefix(name, "resource") && name != "resource" || strings.HasPrefix(name, "fw_upload")
}

// add copies one entry (file or link) found at p.
func (s *snapshot) add(p string, d fs.DirEntry) {
	if d.Type()&fs.ModeSymlink != 0 {
		if t, err := os.Readlink(p); err == nil {
			s.links[p] = t
		}
		return
	}
	if !d.Type().IsRegular() {
		return
	}
	b, err := os.ReadFile(p)
	if err != nil || !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 || len(b) > 64<<10 {
		return
	}
	s.files[p] = b
}

// tree copies dir down to maxDepth levels (1 = its own entries).
func (s *snapshot) tree(dir string, maxDepth int) {
	base := strings.Count(dir, "/")
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if p != dir && s.skip(d.Name()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			if strings.Count(p, "/")-base >= maxDepth {
				return fs.SkipDir
			}
			s.dirs[p] = true
			return nil
		}
		s.add(p, d)
		return nil
	})
}

// device copies the device at real path dev and its ancestors' attributes.
func (s *snapshot) device(dev string) {
	s.tree(dev, 64)
	for p := filepath.Dir(dev); p != filepath.Join(s.root, "devices") && len(p) > len(s.root); p = filepath.Dir(p) {
		s.tree(p, 1)
	}
}

func (s *snapshot) take() {
	var devs []string
	for _, bus := range []string{"cxl", "dax", "node"} {
		s.tree(filepath.Join(s.root, "bus", bus), 3)
		ents, _ := os.ReadDir(filepath.Join(s.root, "bus", bus, "devices"))
		for _, e := range ents {
			if r, err := filepath.EvalSymlinks(filepath.Join(s.root, "bus", bus, "devices", e.Name())); err == nil {
				devs = append(devs, r)
			}
		}
	}
	// Shallowest first; a device inside one already copied is in that copy.
	slices.SortFunc(devs, func(a, b string) int { return len(a) - len(b) })
	var done []string
	for _, d := range devs {
		if slices.ContainsFunc(done, func(r string) bool { return strings.HasPrefix(d+"/", r+"/") }) {
			continue
		}
		done = append(done, d)
		s.device(d)
	}
	s.tree(filepath.Join(s.root, "devices/system/node"), 3)
	s.tree(filepath.Join(s.root, "devices/virtual/memory_tiering"), 64)
	cpus, _ := filepath.Glob(filepath.Join(s.root, "devices/system/cpu/cpu[0-9]*/online"))
	for _, c := range cpus {
		if b, err := os.ReadFile(c); err == nil {
			s.files[c] = b
		}
	}
	// The CXL root (ACPI0017) and host bridges (ACPI0016) that ports name.
	acpi, _ := filepath.Glob(filepath.Join(s.root, "devices/platform/ACPI001[67]:*"))
	for _, a := range acpi {
		s.tree(a, 1)
	}
}

// write writes the tree as a tar whose names are relative to the root.
func (s *snapshot) write(out string) (int, error) {
	var names []string
	for p := range s.files {
		names = append(names, p)
	}
	for p := range s.links {
		names = append(names, p)
	}
	for p := range s.dirs {
		names = append(names, p)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	f, err := os.Create(out)
	if err != nil {
		return 0, err
	}
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, err := filepath.Rel(s.root, p)
		if err != nil || rel == "." {
			continue
		}
		h := &tar.Header{Name: rel, Mode: 0o644, Format: tar.FormatPAX}
		switch {
		case s.links[p] != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, s.links[p], 0o777
		case s.dirs[p]:
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, rel+"/", 0o755
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(s.files[p]))
		}
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return 0, err
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(s.files[p])
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return 0, err
	}
	return len(names), f.Close()
}

// snap is the subcommand: labcheck snap -o OUT.tar [-root /sys] [-name N].
func snap(args []string) bool {
	fl := flag.NewFlagSet("snap", flag.ExitOnError)
	out := fl.String("o", "sysfs.tar", "output tar")
	root := fl.String("root", "/sys", "sysfs root")
	name := fl.String("name", "sysfs-snapshot", "name of the check to print")
	fl.Parse(args)
	s := &snapshot{root: filepath.Clean(*root), files: map[string][]byte{}, links: map[string]string{}, dirs: map[string]bool{}}
	s.take()
	n, err := s.write(*out)
	if err != nil {
		return result(*name, false, "write %s: %v", *out, err)
	}
	return result(*name, n > 0, "%d entries (%d attributes, %d links) in %s", n, len(s.files), len(s.links), filepath.Base(*out))
}
