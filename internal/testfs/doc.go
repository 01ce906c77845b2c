// Package testfs gives tests small filesystems they can fill: a tmpfs of a
// chosen size mounted on a temporary directory (root only; the test is
// skipped with the reason otherwise), and a filler file that leaves a
// chosen amount of room; regular files standing in for the devdax
// devices of a sysfs fixture tree; and a sysfs root switched between
// fixture trees, as a host's changes when devices come and go. It is for
// tests only.
//
// Its functions are safe to call from parallel tests; each mount is
// independent.
package testfs
