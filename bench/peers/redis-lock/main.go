// The usual Redis lock (Redisson-style) as a peer for bench/handoff; modes and output are the
// harness package's. Acquire is SET key token NX PX ttl with a random token,
// retried every 50 ms while taken; release is a Lua compare-and-delete; while held, a watchdog
// renews the TTL with a Lua compare-and-pexpire every ttl/3 (Redisson's lockWatchdogTimeout).
//
//	redis-lock -addr HOST:PORT -lock NAME [-ttl-ms MS] uncontended CYCLES | contend C SECONDS | hold | wait
//
// Each contender has its own client with one connection, like one process each.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"podlock.io/bench/peers/harness"
)

const poll = 50 * time.Millisecond

var (
	release = redis.NewScript(`if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end`)
	renew   = redis.NewScript(`if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end`)
)

type mutex struct {
	rdb      *redis.Client
	key      string
	ttl      time.Duration
	token    string
	stop     chan struct{}
	renewing sync.WaitGroup
}

func (m *mutex) Lock(ctx context.Context) error {
	m.token = rand.Text()
	for {
		err := m.rdb.Do(ctx, "SET", m.key, m.token, "NX", "PX", m.ttl.Milliseconds()).Err()
		if err == nil {
			break
		}
		if err != redis.Nil {
			return err
		}
		time.Sleep(poll)
	}
	m.stop = make(chan struct{})
	m.renewing.Add(1)
	go m.watchdog(ctx, m.token, m.stop)
	return nil
}

func (m *mutex) watchdog(ctx context.Context, token string, stop chan struct{}) {
	defer m.renewing.Done()
	t := time.NewTicker(m.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			n, err := renew.Run(ctx, m.rdb, []string{m.key}, token, m.ttl.Milliseconds()).Int()
			if err != nil || n == 0 {
				fmt.Fprintln(os.Stderr, "watchdog: renewal failed, lock may be lost:", err)
				return
			}
		}
	}
}

func (m *mutex) Unlock(ctx context.Context) error {
	close(m.stop)
	m.renewing.Wait()
	n, err := release.Run(ctx, m.rdb, []string{m.key}, m.token).Int()
	if err == nil && n == 0 {
		err = errors.New("unlock: lock was not held (expired)")
	}
	return err
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server")
	lock := flag.String("lock", "bench", "lock name")
	ttlMs := flag.Int("ttl-ms", 30000, "lock TTL in ms, renewed every ttl/3 while held")
	flag.Parse()
	harness.Run(func() harness.Locker {
		rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: 1})
		return &mutex{rdb: rdb, key: "bench-go:" + *lock, ttl: time.Duration(*ttlMs) * time.Millisecond}
	})
}
