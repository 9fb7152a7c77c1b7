// etcd's own Go lock (client/v3/concurrency.Mutex), measured the way bench/handoff.rs measures
// podlock, so both land in one table. Prints one JSON object.
//
//	etcd-mutex -endpoint URL -lock NAME uncontended CYCLES
//	etcd-mutex -endpoint URL -lock NAME contend CONTENDERS SECONDS
//
// Each contender has its own client and session, like one process each.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func mutex(endpoint, name string) (*concurrency.Mutex, func()) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	must(err)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(15))
	must(err)
	return concurrency.NewMutex(s, "/bench-go/"+name), func() { s.Close(); cli.Close() }
}

func pct(d []time.Duration, p float64) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d))*p+0.999999) - 1
	if i < 0 {
		i = 0
	}
	return d[i].Seconds() * 1000
}

func main() {
	endpoint := flag.String("endpoint", "http://127.0.0.1:2379", "etcd")
	lock := flag.String("lock", "bench", "lock name")
	flag.Parse()
	ctx := context.Background()
	out := map[string]any{}
	switch flag.Arg(0) {
	case "uncontended":
		n, _ := strconv.Atoi(flag.Arg(1))
		m, done := mutex(*endpoint, *lock)
		defer done()
		for i := 0; i < n/10; i++ {
			must(m.Lock(ctx))
			must(m.Unlock(ctx))
		}
		var d []time.Duration
		start := time.Now()
		for i := 0; i < n; i++ {
			t := time.Now()
			must(m.Lock(ctx))
			must(m.Unlock(ctx))
			d = append(d, time.Since(t))
		}
		out["cycles_per_s"] = float64(n) / time.Since(start).Seconds()
		out["p50_ms"], out["p99_ms"] = pct(d, 0.5), pct(d, 0.99)
	case "contend":
		c, _ := strconv.Atoi(flag.Arg(1))
		secs, _ := strconv.ParseFloat(flag.Arg(2), 64)
		window := time.Duration(secs * float64(time.Second))
		var mu sync.Mutex
		var waits []time.Duration
		grants := make([]int, c)
		ms := make([]*concurrency.Mutex, c)
		for i := range ms {
			m, done := mutex(*endpoint, *lock)
			defer done()
			ms[i] = m
		}
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < c; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				for time.Since(start) < window {
					t := time.Now()
					must(ms[i].Lock(ctx))
					w := time.Since(t)
					must(ms[i].Unlock(ctx))
					mu.Lock()
					waits = append(waits, w)
					grants[i]++
					mu.Unlock()
				}
			}(i)
		}
		wg.Wait()
		sort.Ints(grants)
		out["handoffs_per_s"] = float64(len(waits)) / time.Since(start).Seconds()
		out["p99_wait_ms"] = pct(waits, 0.99)
		out["min_grants"], out["max_grants"] = grants[0], grants[c-1]
	default:
		fmt.Fprintln(os.Stderr, "usage: etcd-mutex [-endpoint URL] [-lock NAME] uncontended N | contend C SECONDS")
		os.Exit(2)
	}
	must(json.NewEncoder(os.Stdout).Encode(out))
}
