package rlstest

import (
	"syscall"
	"testing"
	"time"
)

// ProcessCPU returns the CPU time, user and system, this process has used so far.
func ProcessCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ReportCPU reports the CPU time this process used per op since start (from ProcessCPU) as
// cpu-ns/op. Beside ns/op, which is wall time, it counts what the kernel did for the process
// (syscalls, the network stack of its round trips) and leaves out the time it waited: what a
// decision costs the machine the process runs on.
func ReportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(ProcessCPU(b)-start)/float64(b.N), "cpu-ns/op")
}
