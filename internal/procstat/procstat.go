package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrMalformed is a stat line that does not hold a command name in
// parentheses followed by fields.
var ErrMalformed = errors.New("procstat: malformed /proc/PID/stat line")

// Fields returns the fields of process pid's /proc/PID/stat after its
// command name: Fields[0] is the state (field 3 of proc(5)), so field n is
// Fields[n-3]. An error wraps fs.ErrNotExist when the process is gone.
func Fields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return f, nil
}

// Parse splits a /proc/PID/stat line as Fields does. The command name, in
// parentheses, may hold spaces and parentheses of its own: the fields
// count from the last ')'.
func Parse(b []byte) ([]string, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || bytes.IndexByte(b[:i], '(') < 0 {
		return nil, fmt.Errorf("%w: no command name in parentheses", ErrMalformed)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) == 0 {
		return nil, fmt.Errorf("%w: no fields after the command name", ErrMalformed)
	}
	return f, nil
}
