package main

// cycles reads the time-stamp counter (RDTSC): the clock perftest times its
// operations with, and one that costs no system call where the kernel's
// clock source is not the TSC (the lab's TCG guest runs on the HPET, whose
// every read is a system call and an emulated device access, several
// microseconds that time.Now added to each timed operation).
func cycles() uint64
