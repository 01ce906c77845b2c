// Package procstat reads a process's line in /proc/PID/stat: the fields
// after its command name, which may itself hold spaces and parentheses.
// poold uses it to tell a running process from one that ended or whose pid
// was reused (its start time); the benchmarks to read a process's CPU
// time. Its functions are safe for concurrent use.
//
// # OS and tags
//
// Fields reads /proc and works on Linux only (elsewhere the file is not
// there and it returns an error wrapping fs.ErrNotExist); Parse builds
// everywhere.
package procstat
