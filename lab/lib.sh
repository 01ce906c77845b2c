# Shared settings of the farmem lab (sourced by run.sh and image.sh).
# Everything is written under $FARMEM_LAB (default /var/tmp/farmem-lab);
# nothing else on the host is touched.
FARMEM_LAB=${FARMEM_LAB:-/var/tmp/farmem-lab}
LAB=$FARMEM_LAB
SUITE=${SUITE:-bookworm}
# The Debian mirror this machine's apt already uses (deb822 first, then sources.list).
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)}
MIRROR=${MIRROR:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${FARMEM_SRC:-$(cd "$HERE/.." && pwd)}
QEMU=${QEMU:-qemu-system-x86_64}
KCMD="root=/dev/vda rw console=ttyS0 init=/sbin/lab-init panic=-1 quiet loglevel=4"

now() { date +%s.%N; }

# download_failed LOG: whether debootstrap's LOG says a package download
# failed (mirror unreachable), as opposed to a real failure.
download_failed() {
  grep -q -E "Failed getting release file|Couldn't download|Failure trying to run|E: .*download|Temporary failure resolving|Could not resolve|Connection (refused|timed out)" "$1"
}
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.0f", b-a}'; }
say() { echo "lab: $*"; }

# vm_base VCPUS MEMORY: what every guest shares. The Debian kernel and initrd
# (from $IMG, default $LAB: the Debian 12 image; $LAB/trixie holds Debian 13's),
# the ext4 root image with snapshot=on (never modified, so guests may share
# it) and a virtio-9p share ($LAB/share -> /lab) with the guest scripts and
# the binaries under test. Devices sit on pcie.0: with a pxb-cxl present,
# QEMU 7.2's automatic placement tries the CXL host bridge and refuses.
vm_base() {
  echo -accel tcg -cpu "${CPU:-max}" -smp "$1" -m "$2" -nographic -no-reboot \
    -kernel "${IMG:-$LAB}/boot/vmlinuz" -initrd "${IMG:-$LAB}/boot/initrd.img" \
    -drive file="${IMG:-$LAB}/rootfs.img",if=none,id=root,format=raw,snapshot=on \
    -device virtio-blk-pci,drive=root,bus=pcie.0 \
    -fsdev local,id=labfs,path="$LAB/share",security_model=none \
    -device virtio-9p-pci,fsdev=labfs,mount_tag=lab,bus=pcie.0
}

# run_vm NAME TIMEOUT_S qemu-args...: run one guest, wait for it to power
# off, and kill it (by its own PID, nothing else) if it runs past TIMEOUT_S.
# The serial console goes to $LAB/logs/NAME.log.
run_vm() {
  local name=$1 to=$2; shift 2
  mkdir -p "$LAB/run" "$LAB/logs"
  "$QEMU" "$@" > "$LAB/logs/$name.log" 2>&1 &
  local pid=$! i
  echo $pid > "$LAB/run/$name.pid"
  for ((i = 0; i < to; i++)); do
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if kill -0 $pid 2>/dev/null; then
    echo "LAB-RESULT $name-timeout FAIL killed qemu pid $pid after ${to}s" | tee -a "$LAB/logs/$name.log"
    kill $pid; sleep 2; kill -9 $pid 2>/dev/null
  fi
  wait $pid 2>/dev/null
  rm -f "$LAB/run/$name.pid"
  say "$name guest: ${i}s"
}

# check_results LOG...: print the guest's LAB-RESULT lines as one
# "PASS|FAIL name detail" line per check; fail on any FAIL, on no PASS, or on
# a guest that did not reach the end of its script.
#
# The log is read into a variable first: with pipefail, "tr | grep -q" fails
# when grep stops at its first match and tr dies of SIGPIPE on a long log
# (a CI run whose every check passed was reported failed that way).
check_results() {
  local f text rc=0
  for f in "$@"; do
    text=$(tr -d '\r' < "$f")
    sed -n 's/^LAB-RESULT \([^ ]*\) \(PASS\|FAIL\|SKIP\) *\(.*\)$/\2 \1 \3/p' <<< "$text"
    if ! grep -q '^LAB: done' <<< "$text"; then
      echo "FAIL $(basename "$f" .log)-finished guest did not reach the end of its script (see $f)"; rc=1
    fi
    grep -q -E '^LAB-RESULT [^ ]* FAIL' <<< "$text" && rc=1
    grep -q -E '^LAB-RESULT [^ ]* PASS' <<< "$text" || rc=1
  done
  return $rc
}
