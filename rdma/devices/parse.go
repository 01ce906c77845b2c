package devices

import (
	"strconv"
	"strings"
)

// ParseEnum reads an InfiniBand sysfs enumeration as the kernel writes it,
// "<number>: <name>" (state "4: ACTIVE", phys_state "5: LinkUp", node_type
// "1: CA"), returning both parts. The name may contain spaces
// ("4: PortConfigurationTraining", "7: Phy Test").
func ParseEnum(s string) (int, string, error) {
	t := strings.TrimSpace(s)
	num, name, ok := strings.Cut(t, ":")
	if !ok {
		return 0, "", &SyntaxError{Value: s, Want: `"<number>: <name>", e.g. "4: ACTIVE"`}
	}
	n, err := strconv.Atoi(strings.TrimSpace(num))
	name = strings.TrimSpace(name)
	if err != nil || n < 0 || name == "" {
		return 0, "", &SyntaxError{Value: s, Want: `"<number>: <name>", e.g. "4: ACTIVE"`}
	}
	return n, name, nil
}
