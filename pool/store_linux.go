package pool

import (
	"os"
	"strings"
)

// bootID is the kernel's id of this boot of the host, new at every boot;
// "" when it cannot be read.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
