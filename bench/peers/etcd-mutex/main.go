// etcd's own Go lock (client/v3/concurrency.Mutex) as a peer for bench/handoff; modes and
// output are the harness package's.
//
//	etcd-mutex -endpoint URL -lock NAME [-ttl S] uncontended CYCLES | contend C SECONDS | hold | wait
//
// Each contender has its own client and session, like one process each. -ttl is the session's
// lease TTL: after a kill -9 of the holder, a waiter gets the lock when that lease expires.
package main

import (
	"context"
	"flag"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"podlock.io/bench/peers/harness"
)

type mutex struct{ *concurrency.Mutex }

func (m mutex) Lock(ctx context.Context) error   { return m.Mutex.Lock(ctx) }
func (m mutex) Unlock(ctx context.Context) error { return m.Mutex.Unlock(ctx) }

func main() {
	endpoint := flag.String("endpoint", "http://127.0.0.1:2379", "etcd")
	lock := flag.String("lock", "bench", "lock name")
	ttl := flag.Int("ttl", 15, "session lease TTL in seconds")
	flag.Parse()
	harness.Run(func() harness.Locker {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*endpoint}, DialTimeout: 5 * time.Second})
		harness.Must(err)
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
		harness.Must(err)
		return mutex{concurrency.NewMutex(s, "/bench-go/"+*lock)}
	})
}
