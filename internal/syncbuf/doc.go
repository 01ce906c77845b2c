// Package syncbuf provides Buffer, a byte buffer that one goroutine (a
// logger, a child process's output copier) writes while another reads it.
// Tests use it to collect the logs and output of daemons and commands they
// run.
package syncbuf
