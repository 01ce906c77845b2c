// Package pooltest starts a poold inside a test process, on temporary
// directories and a plain sysfs tree, for tests of the client library and
// the CLI. It is for tests only.
//
// Start is safe to call from parallel tests; each daemon is independent.
package pooltest
