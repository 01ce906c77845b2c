// Package logsample bounds the log lines a flood of like events can write.
// A Sampler lets through one line per key (a kind of event, and whose it
// is) per Interval and counts the lines it held back, which the next line
// of that key reports. So an attacker who provokes a warning as fast as
// the network allows fills neither the disk nor the operator's view, and
// the lines of other keys still show. Callers count the events themselves
// (metrics), every one, sampled or not.
package logsample
