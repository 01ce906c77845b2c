// Package newcomer holds the test that follows README.md as a new user
// does, on a scratch copy of the checkout: it builds with the README's own
// build line, runs the quick start, starts the two poolds of "A pool of
// several hosts" with TLS and runs that section's memctl commands, then
// every memctl subcommand with a relative --socket. The commands are read
// from the README's fenced code blocks by section heading, so the test
// follows the README when it changes and fails when a block it needs is
// gone. It also checks that every test the README and docs/ name exists,
// and every path a `go run`/`go test`/`go build` there names.
//
// What the test changes in the commands it reads, and nothing else:
//   - each 127.0.0.1:PORT gets a free port it picks (the same README port,
//     the same free port, so --join still names the first daemon);
//   - each /tmp/ becomes t/, a directory in the scratch copy, so every
//     --socket, --data-dir and --dir is a path relative to the directory
//     the commands run in;
//   - each poold line gets --shm-dir t/shm-NODE, so the daemons' segment
//     files live in the scratch copy, not in /dev/shm after the test.
//
// It needs go and git (it skips, saying so, without them) and no root.
// The package has no code besides its tests.
package newcomer
