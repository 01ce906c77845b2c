#!/bin/sh
# Guest-side dispatcher: lab.role=<name> on the kernel command line picks
# the test script. Results are LAB-RESULT lines on the serial console.
case "$1" in
  cxl) exec /lab/cxl.sh ;;
  cxl-ram) exec /lab/cxl-ram.sh ;;
  rdma) exec /lab/rdma.sh ;;
  shell) exec /bin/sh ;;
  *) echo "LAB-RESULT role FAIL unknown role '$1'" ;;
esac
