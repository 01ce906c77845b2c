//go:build !linux

package main

func numa([]string) bool { return result("numa-pages", false, "needs Linux (move_pages)") }
