package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// heapFloor is the least heap the garbage collector lets the proxy grow to between two cycles.
// A proxy's live heap is small (about 2 MB under load: what it holds is its requests in flight),
// and Go's default (GOGC=100) collects whenever the heap has doubled, but at 4 MB at the least: at
// 3,500 thread turns a second that was 40 collections a second, 10 % of the proxy's CPU. With
// the floor, a collection comes every 16 MB allocated; once the live heap is above half of it
// (large bodies, many streams), Go's default applies unchanged.
const heapFloor = 16 << 20

// keepHeapFloor holds the heap's goal at heapFloor at the least, for the life of the process:
// after every collection it sets the GOGC that puts the goal there for the live heap it found.
// An operator's GOGC (the environment variable, when not empty: Go reads an empty one as its
// default) is left alone, and GOMEMLIMIT still caps the goal as Go documents.
func keepHeapFloor() {
	if os.Getenv("GOGC") != "" {
		return
	}
	tuneGC(heapFloor)
}

// tuneGC sets GOGC for floor and the heap the last collection left, and again after the next
// collection: a cleanup runs once a collection found its object unreachable.
func tuneGC(floor uint64) {
	debug.SetGCPercent(gcPercent(liveHeap(), floor))
	runtime.AddCleanup(new([16]byte), tuneGC, floor) // 16 bytes: not in the tiny allocator's shared blocks
}

// gcPercent is the GOGC that puts the heap's goal at floor for a live heap of live bytes, or
// Go's default, 100 (a goal of twice the live heap), once that reaches floor. Go's goal is the
// larger of live×(1+GOGC/100) and its minimum heap, 4 MB×GOGC/100: both stay at floor at most.
func gcPercent(live, floor uint64) int {
	const minHeap = 4 << 20 // Go's minimum heap at GOGC=100
	if 2*live >= floor {
		return 100
	}
	p := floor*100/max(live, 1) - 100
	return int(min(p, floor*100/minHeap))
}

// liveHeap is the heap the last collection marked live, in bytes.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
