// Package lincheck records histories of reads, writes and compare-and-swaps
// on 64-bit registers and checks them for linearizability with porcupine,
// for the tests of shared segments (package coherence, alloc's shared
// segments and the multi-host tests).
//
// A Recorder is safe for concurrent use. Faults are expressed on the
// history: an operation whose outcome is unknown (its client died,
// partitioned or lost the writes it had not synced) is recorded with
// Unknown, and the model lets it take effect at any point after its call,
// or never observably.
//
// Pure Go; no OS or tags needed.
package lincheck

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// OpKind is what an operation did.
type OpKind uint8

// The operations on a register.
const (
	Read OpKind = iota
	Write
	CAS
)

// Input is an operation's argument: on which register (Key), and the
// values.
type Input struct {
	Kind OpKind
	Key  int
	// Value is what Write stores.
	Value uint64
	// Old and New are CAS's arguments.
	Old, New uint64
	// Unknown marks an operation whose outcome is not known.
	Unknown bool
}

// Output is an operation's result: Value for Read, Swapped for CAS.
type Output struct {
	Value   uint64
	Swapped bool
}

// Recorder collects a history. Safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

// NewRecorder starts an empty history.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now is the recorder's clock (monotonic nanoseconds).
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Add records one completed operation of client that was called at call.
func (r *Recorder) Add(client int, in Input, out Output, call int64) {
	ret := r.Now()
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
	r.mu.Unlock()
}

// AddOp records one completed operation of client with its call and
// return times read elsewhere (another process's clock of the same
// machine, say CLOCK_MONOTONIC), on the same scale as every other time in
// the history. Times must stay below 1<<62, which marks an unknown return.
func (r *Recorder) AddOp(client int, in Input, out Output, call, ret int64) {
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
	r.mu.Unlock()
}

// AddUnknown records an operation whose outcome is unknown: it may have
// taken effect at any time after call, or never observably. Reads are not
// recorded (they constrain nothing).
func (r *Recorder) AddUnknown(client int, in Input, call int64) {
	if in.Kind == Read {
		return
	}
	in.Unknown = true
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Return: 1 << 62})
	r.mu.Unlock()
}

// Forget turns the completed operations of client that returned in
// [from, to) into unknown ones (writes that were lost with their client's
// unsynced data; reads of them are dropped).
func (r *Recorder) Forget(client int, from, to int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = slices.DeleteFunc(r.ops, func(o porcupine.Operation) bool {
		in := o.Input.(Input)
		return o.ClientId == client && o.Return >= from && o.Return < to && in.Kind == Read
	})
	for i := range r.ops {
		o := &r.ops[i]
		in := o.Input.(Input)
		if o.ClientId == client && o.Return >= from && o.Return < to && !in.Unknown {
			in.Unknown = true
			o.Input, o.Return = in, 1<<62
		}
	}
}

// Ops returns a copy of the history.
func (r *Recorder) Ops() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Model is the sequential specification: independent 64-bit registers,
// all zero at first, with read, write and compare-and-swap.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[int][]porcupine.Operation{}
		var keys []int
		for _, o := range history {
			k := o.Input.(Input).Key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], o)
		}
		slices.Sort(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		st := state.(uint64)
		in := input.(Input)
		switch in.Kind {
		case Read:
			return output.(Output).Value == st, st
		case Write:
			return true, in.Value
		default: // CAS
			if in.Unknown {
				if st == in.Old {
					return true, in.New
				}
				return true, st
			}
			out := output.(Output)
			if out.Swapped {
				return st == in.Old, in.New
			}
			return st != in.Old, st
		}
	},
	Equal: func(a, b any) bool { return a.(uint64) == b.(uint64) },
	DescribeOperation: func(input, output any) string {
		in := input.(Input)
		u := ""
		if in.Unknown {
			u = "?"
		}
		switch in.Kind {
		case Read:
			return fmt.Sprintf("read(k%d) -> %d", in.Key, output.(Output).Value)
		case Write:
			return fmt.Sprintf("write(k%d, %d)%s", in.Key, in.Value, u)
		default:
			if in.Unknown {
				return fmt.Sprintf("cas(k%d, %d, %d)?", in.Key, in.Old, in.New)
			}
			return fmt.Sprintf("cas(k%d, %d, %d) -> %t", in.Key, in.Old, in.New, output.(Output).Swapped)
		}
	},
	DescribeState: func(state any) string { return fmt.Sprint(state.(uint64)) },
}

// Check runs porcupine on the history with a timeout (0: none). When the
// history is not linearizable (or the check timed out) it writes
// porcupine's visualization into dir and returns its path; ok is true only
// for a history proven linearizable.
//
// Unknown-outcome operations are what makes porcupine's search long: each
// may take effect anywhere after its call, so a register with a score of
// them (a partitioned client's lost writes) can take minutes where one
// without takes milliseconds. Check therefore first checks the history
// without the unknown ones whose effect nobody observed (Unobserved); a
// pass there is a pass (they did not take effect), and only a failure runs
// the whole history, in the time left (at least half the timeout: proving
// the smaller history illegal can take as long as checking the whole).
func Check(ops []porcupine.Operation, timeout time.Duration, dir string) (ok bool, path string, err error) {
	// porcupine takes a timeout of 0 as none; so does Check. Otherwise each
	// check gets at least a moment, enough to find an early violation.
	deadline := time.Now().Add(timeout)
	left := func(d time.Duration) time.Duration {
		if timeout <= 0 {
			return 0
		}
		return max(d, time.Millisecond)
	}
	if seen := Unobserved(ops); len(seen) < len(ops) {
		if porcupine.CheckOperationsTimeout(Model, seen, left(timeout/2)) == porcupine.Ok {
			return true, "", nil
		}
	}
	res, info := porcupine.CheckOperationsVerbose(Model, ops, left(time.Until(deadline)))
	if res == porcupine.Ok {
		return true, "", nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, "", fmt.Errorf("lincheck: keep the failing history: %w", err)
	}
	path = filepath.Join(dir, fmt.Sprintf("history-%s-%d.html", res, time.Now().UnixNano()))
	if err := porcupine.VisualizePath(Model, info, path); err != nil {
		return false, path, fmt.Errorf("lincheck: write %s: %w", path, err)
	}
	return false, path, nil
}

// Unobserved returns the history without its unknown-outcome writes and
// compare-and-swaps whose value no other operation saw: no completed read
// returned it, no compare-and-swap that swapped (or an unknown one kept)
// expected it. If what is left is linearizable, so is the history: the
// model lets an unknown operation never take effect observably, which
// these can do by being placed after everything else (an unknown one
// that returned before some call is kept). The converse does
// not hold (a write nobody read can explain a compare-and-swap that
// failed), so a failure here says nothing; Check then runs the whole
// history. Values are compared per register.
func Unobserved(ops []porcupine.Operation) []porcupine.Operation {
	type kv struct {
		key int
		v   uint64
	}
	seen := map[kv]bool{}
	var last int64 // the last call
	for _, o := range ops {
		in := o.Input.(Input)
		last = max(last, o.Call)
		switch {
		case in.Unknown:
		case in.Kind == Read:
			seen[kv{in.Key, o.Output.(Output).Value}] = true
		case in.Kind == CAS && o.Output.(Output).Swapped:
			seen[kv{in.Key, in.Old}] = true
		}
	}
	keep := make([]bool, len(ops))
	// An unknown compare-and-swap kept expects a value, which keeps the
	// unknown operation that may have written it: to a fixed point.
	for changed := true; changed; {
		changed = false
		for i, o := range ops {
			in := o.Input.(Input)
			if keep[i] || !in.Unknown {
				continue
			}
			v := in.Value
			if in.Kind == CAS {
				v = in.New
			}
			if in.Kind == Read || seen[kv{in.Key, v}] || o.Return < last {
				keep[i], changed = true, true
				if in.Kind == CAS {
					seen[kv{in.Key, in.Old}] = true
				}
			}
		}
	}
	out := make([]porcupine.Operation, 0, len(ops))
	for i, o := range ops {
		if keep[i] || !o.Input.(Input).Unknown {
			out = append(out, o)
		}
	}
	return out
}
