#!/bin/bash
# farmem lab: boots Debian's kernel under QEMU (TCG, no KVM needed) with an
# emulated CXL Type-3 device and a Soft-RoCE NIC, and runs poold, memctl and
# farmem's verbs transport on them. One line per check (PASS/FAIL/SKIP).
#
#   lab/run.sh [-d DIR] [--only cxl|cxl-ram|rdma] [--update-fixtures] [--report-perf]
#   lab/run.sh [-d DIR] --prepare
#
#   -d DIR             cache and work directory (default $FARMEM_LAB or
#                      /var/tmp/farmem-lab): the guest images are built there
#                      once (~2-9 min, depending on the mirror) and reused
#   --only GUEST       run one guest: cxl (persistent CXL memory: devdax and
#                      system-ram), cxl-ram (volatile CXL memory, a memory
#                      expander: QEMU 10 and kernel 6.12 from Debian 13), rdma
#   --update-fixtures  copy the guest's sysfs trees into cxl/testdata/qemu-*
#                      (otherwise they are only checked by the cxl tests)
#   --report-perf      print the verbs-vs-perftest ratios as SKIP lines
#                      instead of PASS/FAIL (CI: a shared host's load makes
#                      TCG timings too noisy to gate on), from five latency
#                      rounds and one bandwidth round instead of 15 and 3
#   --prepare          build (or find cached) the guest images and the QEMU
#                      10 chroot, and exit: CI does it beside other work
#
# Needs root (debootstrap, chroot) and the Debian packages qemu-system-x86
# qemu-utils debootstrap e2fsprogs, plus libibverbs-dev gcc pkg-config for
# the verbs binaries. Exit status: 0 all passed, 1 a check failed, 3 the
# image could not be built because a package download failed.
set -uo pipefail
ONLY=""
UPDATE=0
PERF=enforce
PREPARE=0
while [ $# -gt 0 ]; do
  case "$1" in
    -d) export FARMEM_LAB=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --update-fixtures) UPDATE=1 ;;
    --report-perf) PERF=report ;;
    --prepare) PREPARE=1 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "lab/run.sh: unknown argument $1 (see --help)"; exit 2 ;;
  esac
  shift
done
case "$ONLY" in
  ""|cxl|cxl-ram|rdma) ;;
  *) echo "lab/run.sh: --only takes cxl, cxl-ram or rdma, not '$ONLY'"; exit 2 ;;
esac
. "$(dirname "$0")/lib.sh"
T0=$(now)
# A guest still running when this script is stopped (timeout, ^C) is
# killed by the PID run_vm recorded, never by name.
stop_guests() {
  local f
  for f in "$LAB"/run/*.pid; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
}
trap 'stop_guests; exit 130' INT TERM

missing=()
for t in qemu-system-x86_64 debootstrap mkfs.ext4 go; do command -v $t >/dev/null || missing+=($t); done
[ -e /usr/include/infiniband/verbs.h ] && command -v gcc >/dev/null || missing+=(libibverbs-dev+gcc)
if [ ${#missing[@]} -gt 0 ]; then
  echo "lab: missing ${missing[*]}; install: apt-get install qemu-system-x86 qemu-utils debootstrap e2fsprogs libibverbs-dev gcc pkg-config"
  exit 2
fi
[ "$(id -u)" = 0 ] || { echo "lab: needs root (debootstrap, chroot)"; exit 2; }

# 1. The guest image (cached).
"$HERE/image.sh"
rc=$?
if [ $rc = 3 ]; then echo "SKIP lab-image a package download failed; the lab did not run"; exit 3; fi
[ $rc = 0 ] || { echo "FAIL lab-image image build failed (see $LAB/*.log)"; exit 1; }

# The volatile CXL guest's QEMU 10 chroot and Debian 13 image (cached).
# A volatile CXL device (volatile-memdev) needs QEMU >= 8 and a kernel >=
# 6.3; Debian 12 has 7.2 and 6.1, so QEMU 10 runs from a Debian 13 chroot
# (qemu10.sh) and the guest is a Debian 13 image.
prepare_cxl_ram() {
  local vrc=0
  "$HERE/qemu10.sh" || vrc=$?
  if [ $vrc = 0 ]; then FARMEM_LAB="$LAB/trixie" SUITE=trixie "$HERE/image.sh" || vrc=$?; fi
  return $vrc
}
if [ $PREPARE = 1 ]; then
  prepare_cxl_ram
  exit $?
fi

# 2. Binaries under test, built on the host: static Go for the CXL guest,
# cgo + libibverbs (-tags verbs) for the RDMA guest.
T1=$(now)
mkdir -p "$LAB/share/bin"
rm -rf "$LAB/share/out"; mkdir -p "$LAB/share/out"
build() { (cd "$REPO" && env GOFLAGS="-buildvcs=false ${LAB_GOFLAGS:-}" "$@") || { echo "FAIL lab-build $*"; exit 1; }; }
build CGO_ENABLED=0 go build -trimpath -o "$LAB/share/bin/" ./cmd/poold ./cmd/memctl ./lab/labcheck
build CGO_ENABLED=1 go build -trimpath -tags verbs -o "$LAB/share/bin/poold-verbs" ./cmd/poold
build CGO_ENABLED=1 go build -trimpath -tags verbs -o "$LAB/share/bin/labcheck-verbs" ./lab/labcheck
echo "PERF=$PERF" > "$LAB/share/env"
install -m 755 "$HERE"/guest/run.sh "$HERE"/guest/common.sh "$HERE"/guest/cxl.sh "$HERE"/guest/hotplug.sh "$HERE"/guest/cxl-ram.sh "$HERE"/guest/rdma.sh "$LAB/share/"
say "binaries: $(elapsed $T1)s"

# 3. The guests, one after the other (the machine may have 2 cores).
rc=0
logs=()
# run_cxl_vm NAME TYPE3-PROPERTIES QEMU-ARGS...: a CXL guest with role NAME,
# one cxl-type3 device (TYPE3-PROPERTIES: its memory backends, from the
# -object QEMU-ARGS) behind a pxb-cxl host bridge in a 4 GiB window.
# Pitfalls, each of which silently breaks a CXL guest:
# - hypervisor=off: kernels >= 6.2 refuse to commit a region when CPUID
#   says "hypervisor" (cpu_cache_invalidate_memregion); harmless under TCG.
# - the second, empty root port (root_port14): with a single dport the 6.1
#   kernel treats the host bridge as pass-through and never commits its HDM
#   decoder; QEMU 7.2 then routes nothing and every read returns 0.
# - maxmem/slots make QEMU emit an ACPI SRAT; without it the CXL window gets
#   no proximity domain, system-ram lands in node 0, and (QEMU cannot DMA
#   into CXL memory) virtio I/O through CXL pages hangs the guest.
run_cxl_vm() {
  local name=$1 type3=$2
  shift 2
  CPU=max,hypervisor=off run_vm "$name" ${TIMEOUT:-600} $(CPU=max,hypervisor=off vm_base 2 2G,maxmem=8G,slots=4) -M q35,cxl=on \
    -append "$KCMD lab.role=$name" \
    -netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0,bus=pcie.0,mac=52:54:00:00:77:01 \
    "$@" \
    -device pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1 \
    -device cxl-rp,port=0,bus=cxl.1,id=root_port13,chassis=0,slot=2 \
    -device cxl-type3,bus=root_port13,"$type3" \
    -device cxl-rp,port=1,bus=cxl.1,id=root_port14,chassis=0,slot=3 \
    -M cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G
  logs+=("$LAB/logs/$name.log")
}
if [ -z "$ONLY" ] || [ "$ONLY" = cxl ]; then
  # Fresh, zeroed backing files every run: old namespace labels in the LSA
  # make create-namespace fail with ENOSPC.
  rm -f "$LAB/cxl-mem0.raw" "$LAB/cxl-lsa0.raw"
  truncate -s 256M "$LAB/cxl-mem0.raw" "$LAB/cxl-lsa0.raw"
  run_cxl_vm cxl memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0 \
    -object memory-backend-file,id=cxl-mem0,share=on,mem-path="$LAB/cxl-mem0.raw",size=256M \
    -object memory-backend-file,id=cxl-lsa0,share=on,mem-path="$LAB/cxl-lsa0.raw",size=256M
fi
if [ -z "$ONLY" ] || [ "$ONLY" = cxl-ram ]; then
  vrc=0
  prepare_cxl_ram || vrc=$?
  if [ $vrc = 3 ]; then
    echo "SKIP cxl-ram-guest a package download for QEMU 10 or the Debian 13 image failed; the volatile CXL guest did not run"
  elif [ $vrc != 0 ]; then
    echo "FAIL cxl-ram-setup QEMU 10 chroot or Debian 13 image (see $LAB/qemu10.log, $LAB/trixie/*.log)"; rc=1
  else
    rm -f "$LAB/cxl-ram0.raw"
    truncate -s 256M "$LAB/cxl-ram0.raw"
    QEMU="$LAB/qemu10.qemu" IMG="$LAB/trixie" run_cxl_vm cxl-ram volatile-memdev=cxl-ram0,id=cxl-vmem0 \
      -object memory-backend-file,id=cxl-ram0,share=on,mem-path="$LAB/cxl-ram0.raw",size=256M
  fi
fi
if [ -z "$ONLY" ] || [ "$ONLY" = rdma ]; then
  # The NIC sits on a QEMU hub with no other port: nothing leaves QEMU.
  run_vm rdma ${TIMEOUT:-600} $(vm_base 2 2G) -M q35 \
    -append "$KCMD lab.role=rdma" \
    -netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0,mac=52:54:00:00:77:01
  logs+=("$LAB/logs/rdma.log")
fi

# 4. Results, then the sysfs trees through the cxl package's tests.
check_results "${logs[@]}" || rc=1
[[ " ${logs[*]} " == *rdma.log* ]] && tr -d '\r' < "$LAB/logs/rdma.log" | sed -n 's/^LAB-TABLE //p' | sed '1i | Soft-RoCE, one guest | farmem verbs | perftest | farmem tcp |\n|---|---|---|---|'
# Each guest that ran must have written its trees: cxl qemu-devdax and
# qemu-numa, cxl-ram qemu-ram.
trees=()
for t in qemu-devdax qemu-numa qemu-ram; do [ -e "$LAB/share/out/$t.tar" ] && trees+=("$t"); done
for l in "${logs[@]}"; do
  case "$(basename "$l" .log)" in
    cxl) want="qemu-devdax qemu-numa" ;;
    cxl-ram) want="qemu-ram" ;;
    *) want="" ;;
  esac
  for t in $want; do
    [[ " ${trees[*]} " == *" $t "* ]] || { echo "FAIL cxl-sysfs-snapshots the $(basename "$l" .log) guest wrote no $t tree"; rc=1; }
  done
done
if [ ${#trees[@]} -gt 0 ]; then
  FX="$LAB/fixtures"
  rm -rf "$FX"
  for t in "${trees[@]}"; do mkdir -p "$FX/$t"; tar -C "$FX/$t" -xf "$LAB/share/out/$t.tar"; done
  if (cd "$REPO" && FARMEM_CXL_FIXTURES="$FX" go test -count=1 -v -run 'TestQEMUFixtures' ./cxl/ >"$LAB/logs/fixtures-test.log" 2>&1); then
    echo "PASS cxl-tests-on-guest-sysfs go test ./cxl -run TestQEMUFixtures on this run's trees (${trees[*]})"
  else
    echo "FAIL cxl-tests-on-guest-sysfs see $LAB/logs/fixtures-test.log"; tail -20 "$LAB/logs/fixtures-test.log"; rc=1
  fi
  if [ $UPDATE = 1 ]; then
    for t in "${trees[@]}"; do rm -rf "$REPO/cxl/testdata/$t"; cp -a "$FX/$t" "$REPO/cxl/testdata/$t"; done
    say "fixtures: copied into cxl/testdata: ${trees[*]}"
  fi
fi
say "total $(elapsed $T0)s; $( [ $rc = 0 ] && echo 'all checks passed' || echo 'some checks FAILED')"
exit $rc
