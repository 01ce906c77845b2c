package testcluster

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
)

// Options says how many test hosts to create and how to name and number
// them. The zero value is valid: three hosts with a process-unique prefix.
type Options struct {
	// Hosts is the number of test hosts. Default 3; at least 1, at most 250
	// and at most what Subnet holds.
	Hosts int
	// Prefix starts every namespace name: "<Prefix>-sw" holds the bridge and
	// "<Prefix>-h<i>" is host i. 1 to 24 characters of [A-Za-z0-9_].
	// Default "fmt<pid>c<n>", n counting the clusters made by this process,
	// so parallel tests and test binaries never clash and New can remove
	// what a crashed test binary left behind.
	Prefix string
	// Subnet is the hosts' IPv4 network in CIDR form, /8 to /30; host i gets
	// the (i+1)-th address in it. Default 10.211.X.0/24, X derived from
	// Prefix. Clusters never share a bridge, so overlapping subnets of two
	// clusters are harmless.
	Subnet string
}

const (
	defaultHosts = 3
	maxHosts     = 250
	maxPrefixLen = 24
)

var (
	prefixRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,24}$`)
	// defaultNameRE matches namespaces named by a default prefix; group 1 is
	// the pid of the test binary that made them.
	defaultNameRE = regexp.MustCompile(`^fmt([0-9]+)c[0-9]+-(sw|h[0-9]+)$`)
	clusterCount  atomic.Int64
)

// config is Options with defaults applied and values parsed.
type config struct {
	hosts  int
	prefix string
	subnet netip.Prefix
}

// resolve applies the defaults and checks every field.
func (o Options) resolve() (config, error) {
	c := config{hosts: o.Hosts, prefix: o.Prefix}
	if c.hosts == 0 {
		c.hosts = defaultHosts
	}
	if c.hosts < 1 || c.hosts > maxHosts {
		return config{}, fmt.Errorf("%w: Hosts is %d; use 1 to %d", ErrInvalidOptions, o.Hosts, maxHosts)
	}
	if c.prefix == "" {
		c.prefix = fmt.Sprintf("fmt%dc%d", os.Getpid(), clusterCount.Add(1)-1)
	}
	if err := checkPrefix(c.prefix); err != nil {
		return config{}, err
	}
	subnet := o.Subnet
	if subnet == "" {
		h := fnv.New32a()
		h.Write([]byte(c.prefix))
		subnet = fmt.Sprintf("10.211.%d.0/24", h.Sum32()%256)
	}
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return config{}, fmt.Errorf("%w: Subnet %q is not CIDR (e.g. 10.211.7.0/24): %v", ErrInvalidOptions, subnet, err)
	}
	if !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 30 {
		return config{}, fmt.Errorf("%w: Subnet %q must be IPv4 with a prefix length of 8 to 30", ErrInvalidOptions, subnet)
	}
	if p.Masked() != p {
		return config{}, fmt.Errorf("%w: Subnet %q has host bits set; use %s", ErrInvalidOptions, subnet, p.Masked())
	}
	if usable := 1<<(32-p.Bits()) - 2; c.hosts > usable {
		return config{}, fmt.Errorf("%w: Subnet %s holds %d hosts, asked for %d; use a shorter prefix length", ErrInvalidOptions, p, usable, c.hosts)
	}
	c.subnet = p
	return c, nil
}

func checkPrefix(prefix string) error {
	if !prefixRE.MatchString(prefix) {
		return fmt.Errorf("%w: Prefix %q must be 1 to %d characters of [A-Za-z0-9_]", ErrInvalidOptions, prefix, maxPrefixLen)
	}
	return nil
}

// switchName is the namespace holding the bridge.
func switchName(prefix string) string { return prefix + "-sw" }

// hostName is host i's namespace.
func hostName(prefix string, i int) string { return prefix + "-h" + strconv.Itoa(i) }

// owns reports whether namespace name belongs to a cluster with prefix.
func owns(prefix, name string) bool {
	if name == switchName(prefix) {
		return true
	}
	rest, ok := strings.CutPrefix(name, prefix+"-h")
	if !ok || rest == "" {
		return false
	}
	for _, r := range rest {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// hostAddr is the (i+1)-th address of subnet.
func hostAddr(subnet netip.Prefix, i int) netip.Addr {
	a := subnet.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// staleOwner returns the pid in a default-prefixed namespace name and the
// prefix, or ok=false for any other name.
func staleOwner(name string) (pid int, prefix string, ok bool) {
	m := defaultNameRE.FindStringSubmatch(name)
	if m == nil {
		return 0, "", false
	}
	pid, err := strconv.Atoi(m[1])
	if err != nil || pid <= 0 {
		return 0, "", false
	}
	prefix, _, _ = strings.Cut(name, "-")
	return pid, prefix, true
}
