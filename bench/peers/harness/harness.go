// Package harness measures a lock the way bench/handoff.rs measures podlock, so every peer lands
// in the same table. A peer's main builds a Locker per contender and calls Run, which prints one
// JSON object (uncontended, contend) or one line (hold, wait).
//
//	PEER [flags] uncontended CYCLES         {"cycles_per_s","p50_ms","p99_ms","cpu_s"}
//	PEER [flags] contend CONTENDERS SECONDS {"handoffs_per_s","grants_per_s","p99_wait_ms",
//	                                         "min_grants","max_grants","cpu_s"}
//	PEER [flags] hold                       "HELD <unix ns>", then holds until killed (SIGTERM:
//	                                        releases first)
//	PEER [flags] wait                       "ACQUIRED <unix ns>", then releases and exits
package harness

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Locker is one contender: its own connection, like one process.
type Locker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// Must exits with the error's text if err is not nil.
func Must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d))*p+0.999999) - 1
	return d[max(i, 0)].Seconds() * 1000
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	Must(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// Run runs the mode named by flag.Args() with contenders made by newLocker.
func Run(newLocker func() Locker) {
	ctx := context.Background()
	out := map[string]any{}
	switch flag.Arg(0) {
	case "uncontended":
		n, _ := strconv.Atoi(flag.Arg(1))
		l := newLocker()
		cycle := func() time.Duration {
			t := time.Now()
			Must(l.Lock(ctx))
			Must(l.Unlock(ctx))
			return time.Since(t)
		}
		for i := 0; i < n/10; i++ {
			cycle()
		}
		var d []time.Duration
		start := time.Now()
		for i := 0; i < n; i++ {
			d = append(d, cycle())
		}
		out["cycles_per_s"] = float64(n) / time.Since(start).Seconds()
		out["p50_ms"], out["p99_ms"] = pct(d, 0.5), pct(d, 0.99)
	case "contend":
		contend(ctx, newLocker, out)
	case "hold":
		l := newLocker()
		Must(l.Lock(ctx))
		fmt.Printf("HELD %d\n", time.Now().UnixNano())
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		Must(l.Unlock(ctx))
		return
	case "wait":
		l := newLocker()
		Must(l.Lock(ctx))
		fmt.Printf("ACQUIRED %d\n", time.Now().UnixNano())
		Must(l.Unlock(ctx))
		return
	default:
		fmt.Fprintln(os.Stderr, "usage: [flags] uncontended CYCLES | contend CONTENDERS SECONDS | hold | wait")
		os.Exit(2)
	}
	out["cpu_s"] = cpuSeconds()
	Must(json.NewEncoder(os.Stdout).Encode(out))
}

// contend loops lock → unlock in every contender for the window. A handoff is a grant to a
// contender other than the previous holder: a lock that lets its releaser barge back in
// (polling locks do) makes many grants but few handoffs.
func contend(ctx context.Context, newLocker func() Locker, out map[string]any) {
	c, _ := strconv.Atoi(flag.Arg(1))
	secs, _ := strconv.ParseFloat(flag.Arg(2), 64)
	window := time.Duration(secs * float64(time.Second))
	lockers := make([]Locker, c)
	for i := range lockers {
		lockers[i] = newLocker()
	}
	var mu sync.Mutex
	var waits []time.Duration
	grants := make([]int, c)
	last, handoffs := -1, 0
	var wg sync.WaitGroup
	start := time.Now()
	for i := range lockers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for time.Since(start) < window {
				t := time.Now()
				Must(lockers[i].Lock(ctx))
				w := time.Since(t)
				mu.Lock()
				if last != i {
					handoffs++
				}
				last = i
				waits = append(waits, w)
				grants[i]++
				mu.Unlock()
				Must(lockers[i].Unlock(ctx))
			}
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	sort.Ints(grants)
	out["handoffs_per_s"] = float64(handoffs) / elapsed
	out["grants_per_s"] = float64(len(waits)) / elapsed
	out["p99_wait_ms"] = pct(waits, 0.99)
	out["min_grants"], out["max_grants"] = grants[0], grants[c-1]
}
