// Command labcheck is the client side of the farmem lab (lab/run.sh): run
// inside the lab guest against a real poold, it allocates segments, checks
// their contents and placement, and measures the verbs data plane. Each
// subcommand prints "LAB-RESULT name PASS|FAIL detail" lines, which the lab
// collects; it exits non-zero when a check failed.
//
//	labcheck put    -socket S -tier cxl -name N -size 8MiB [-want-kind devdax]
//	labcheck get    -socket S -name N
//	labcheck numa   -socket S -node 1 -size 8MiB
//	labcheck verbs  -socket S [-iters 2000] [-bw-mib 64]
//	labcheck snap   -o OUT.tar (the guest's CXL, dax and node sysfs as a fixture tree)
//
// It is not a user tool: it lives in lab/ and needs a guest with the
// devices the lab creates.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: labcheck put|get|numa|verbs|snap [flags]")
		os.Exit(2)
	}
	var ok bool
	switch os.Args[1] {
	case "put":
		ok = put(os.Args[2:])
	case "get":
		ok = get(os.Args[2:])
	case "numa":
		ok = numa(os.Args[2:])
	case "verbs":
		ok = verbsCheck(os.Args[2:])
	case "snap":
		ok = snap(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "labcheck: unknown subcommand %q\n", os.Args[1])
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// result prints one check's line in the lab's format and returns pass.
func result(name string, pass bool, format string, args ...any) bool {
	st := "PASS"
	if !pass {
		st = "FAIL"
	}
	fmt.Printf("LAB-RESULT %s %s %s\n", name, st, fmt.Sprintf(format, args...))
	return pass
}
