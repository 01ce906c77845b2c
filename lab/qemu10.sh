#!/bin/bash
# QEMU 10 for the volatile CXL guest (cxl-type3 volatile-memdev needs QEMU
# >= 8; Debian 12 ships 7.2): debootstraps a small Debian 13 "trixie" chroot
# holding qemu-system-x86 under $FARMEM_LAB/qemu10 (cached) and writes the
# wrapper $FARMEM_LAB/qemu10.qemu, which runs that QEMU in a private mount
# namespace with $FARMEM_LAB bind-mounted at the same path, so no mount
# outlives it. Exit status 3 means a package download failed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
mkdir -p "$LAB"
QROOT=$LAB/qemu10
T0=$(now)
if [ ! -x "$QROOT/usr/bin/qemu-system-x86_64" ]; then
  rm -rf "$QROOT"
  if ! debootstrap --variant=minbase --include=qemu-system-x86 trixie "$QROOT" "$MIRROR" > "$LAB/qemu10.log" 2>&1; then
    tail -20 "$LAB/qemu10.log"
    if download_failed "$LAB/qemu10.log"; then say "qemu10: a package download failed (mirror $MIRROR)"; exit 3; fi
    exit 1
  fi
  rm -f "$QROOT"/var/cache/apt/archives/*.deb
fi
cat > "$LAB/qemu10.qemu" <<WRAP
#!/bin/bash
# trixie's qemu-system-x86_64 from $QROOT, with $LAB visible at its own path
exec unshare -m --propagation private bash -c '
  mkdir -p "$QROOT$LAB" && mount --bind "$LAB" "$QROOT$LAB" &&
  mount -t proc proc "$QROOT/proc" && exec chroot "$QROOT" qemu-system-x86_64 "\$@"' qemu "\$@"
WRAP
chmod 755 "$LAB/qemu10.qemu"
say "qemu10: $("$LAB/qemu10.qemu" --version | head -1) in $(elapsed $T0)s"
