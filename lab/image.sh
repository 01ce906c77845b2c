#!/bin/bash
# Builds the lab guest from Debian packages only, cached under $FARMEM_LAB:
#   rootfs/      debootstrap'ed Debian (minbase + kernel + CXL/NVDIMM/RDMA tools)
#   rootfs.img   ext4 image of it (booted with snapshot=on, never modified)
#   boot/        vmlinuz + initrd.img taken from the rootfs
# Exit status 3 means a package download failed (mirror unreachable): the
# caller may skip the lab; any other non-zero status is a real failure.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
mkdir -p "$LAB"
cd "$LAB"
T0=$(now)
PKGS=linux-image-amd64,initramfs-tools,kmod,udev,iproute2,ndctl,daxctl,rdma-core,ibverbs-providers,ibverbs-utils,perftest,numactl,procps
# The marker names the package list, so changing the list rebuilds.
MARK="rootfs/.lab-done-$(echo "$SUITE $PKGS" | md5sum | cut -c1-12)"
if [ ! -e "$MARK" ]; then
  rm -rf rootfs rootfs.img boot
  # INITRD=No: the kernel's postinst would build a MODULES=most initrd
  # (34 MB, minutes); a small one is built below instead.
  if ! INITRD=No debootstrap --variant=minbase --include=$PKGS "$SUITE" rootfs "$MIRROR" > debootstrap.log 2>&1; then
    tail -20 debootstrap.log
    if download_failed debootstrap.log; then
      say "image: a package download failed (mirror $MIRROR); see $LAB/debootstrap.log"
      exit 3
    fi
    exit 1
  fi
  say "image: debootstrap $(elapsed $T0)s"
  # Small initrd: only what mounting an ext4 root on virtio-blk needs.
  T1=$(now)
  mkdir -p rootfs/etc/initramfs-tools/conf.d rootfs/etc/initramfs-tools/hooks
  echo 'MODULES=list' > rootfs/etc/initramfs-tools/conf.d/lab.conf
  cat > rootfs/etc/initramfs-tools/hooks/lab <<'HOOK'
#!/bin/sh
case "$1" in prereqs) exit 0;; esac
. /usr/share/initramfs-tools/hook-functions
for m in virtio_pci virtio_blk ext4; do force_load $m; done
HOOK
  chmod 755 rootfs/etc/initramfs-tools/hooks/lab
  KVER=$(basename rootfs/lib/modules/*)
  rm -f rootfs/boot/initrd.img-*
  mount -t proc proc rootfs/proc
  trap 'umount "$LAB/rootfs/proc" 2>/dev/null || true' EXIT
  chroot rootfs update-initramfs -c -k "$KVER" > initramfs.log 2>&1 || { cat initramfs.log; exit 1; }
  umount rootfs/proc; trap - EXIT
  say "image: initrd for $KVER $(elapsed $T1)s"
  rm -f rootfs/var/cache/apt/archives/*.deb
  echo lab > rootfs/etc/hostname
  touch "$MARK"
fi
# lab-init is part of the image; rebuild the ext4 file only when it changed.
if [ ! -e rootfs.img ] || ! cmp -s "$HERE/guest/lab-init" rootfs/sbin/lab-init; then
  install -m 755 "$HERE/guest/lab-init" rootfs/sbin/lab-init
  mkdir -p boot
  cp rootfs/boot/vmlinuz-* boot/vmlinuz
  cp rootfs/boot/initrd.img-* boot/initrd.img
  rm -f rootfs.img
  mkfs.ext4 -q -F -L labroot -d rootfs rootfs.img 1536M
fi
say "image: ready in $(elapsed $T0)s ($(basename rootfs/lib/modules/*), $(du -sh rootfs.img | cut -f1) image)"
