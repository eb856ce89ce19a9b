// etcd-lock: the bench's peer for the store. Closed-loop acquire+release
// cycles of etcd's own lock (go.etcd.io/etcd/client/v3/concurrency Mutex)
// against a running etcd, one JSON line per concurrency on stdout:
//
//	{"concurrency":16,"cycles":10000,"secs":1.9,"cycles_per_sec":5263,"p50_us":2900,"p99_us":7100,
//	 "lock_p50_us":1500,"lock_p99_us":3900,"unlock_p50_us":1400,"unlock_p99_us":3500,"errors":0}
//
// (p50/p99 of whole cycles, and of Lock and of Unlock on their own.)
//
// Each worker holds its own session (one etcd lease kept alive, as a
// service using the lock would) and locks its own key, so the figure is the
// cost of the lock itself, not of waiting for another holder: Lock is one
// Txn (put the waiter key under the session's lease, read the owner),
// Unlock one Delete. The worker's fencing token is the revision of its key.
//
// Usage: etcd-lock -endpoints 127.0.0.1:2379 -concurrency 1,16,64 -cycles 10000 -cycles-single 2000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

type cell struct {
	Concurrency  int     `json:"concurrency"`
	Cycles       int     `json:"cycles"`
	Secs         float64 `json:"secs"`
	CyclesPerSec float64 `json:"cycles_per_sec"`
	P50Us        float64 `json:"p50_us"`
	P99Us        float64 `json:"p99_us"`
	LockP50Us    float64 `json:"lock_p50_us"`
	LockP99Us    float64 `json:"lock_p99_us"`
	UnlockP50Us  float64 `json:"unlock_p50_us"`
	UnlockP99Us  float64 `json:"unlock_p99_us"`
	Errors       int64   `json:"errors"`
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "etcd client endpoints, comma-separated")
	concurrencies := flag.String("concurrency", "1,16,64", "closed-loop workers per cell, comma-separated")
	cycles := flag.Int("cycles", 10000, "acquire+release cycles per cell at concurrency > 1")
	cyclesSingle := flag.Int("cycles-single", 2000, "cycles per cell at concurrency 1")
	ttl := flag.Int("ttl", 90, "session lease TTL in seconds")
	prefix := flag.String("prefix", "/etcd-lock-bench", "key prefix")
	flag.Parse()

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 10 * time.Second,
	})
	if err != nil {
		fail("connect: %v", err)
	}
	defer cli.Close()

	// Warm up the connection and etcd before the first cell.
	run(cli, 4, 400, *ttl, *prefix+"/warm")
	for _, s := range strings.Split(*concurrencies, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			fail("bad concurrency %q", s)
		}
		n := *cycles
		if c == 1 {
			n = *cyclesSingle
		}
		out, _ := json.Marshal(run(cli, c, n, *ttl, fmt.Sprintf("%s/c%d", *prefix, c)))
		fmt.Println(string(out))
	}
}

// run drives n acquire+release cycles from c workers, each on its own lock.
func run(cli *clientv3.Client, c, n, ttl int, prefix string) cell {
	ctx := context.Background()
	sessions := make([]*concurrency.Session, c)
	for i := range sessions {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
		if err != nil {
			fail("session: %v", err)
		}
		sessions[i] = s
	}
	var next, errors atomic.Int64
	samples := make([][]time.Duration, c)
	locks := make([][]time.Duration, c)
	unlocks := make([][]time.Duration, c)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			m := concurrency.NewMutex(sessions[w], fmt.Sprintf("%s/w%d", prefix, w))
			lat := make([]time.Duration, 0, n/c+1)
			lock := make([]time.Duration, 0, n/c+1)
			unlock := make([]time.Duration, 0, n/c+1)
			for next.Add(1) <= int64(n) {
				t := time.Now()
				if err := m.Lock(ctx); err != nil {
					errors.Add(1)
					continue
				}
				locked := time.Now()
				lock = append(lock, locked.Sub(t))
				if err := m.Unlock(ctx); err != nil {
					errors.Add(1)
					continue
				}
				unlock = append(unlock, time.Since(locked))
				lat = append(lat, time.Since(t))
			}
			samples[w], locks[w], unlocks[w] = lat, lock, unlock
		}(w)
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	for _, s := range sessions {
		_ = s.Close() // revokes the session's lease
	}
	all, lock, unlock := sorted(samples), sorted(locks), sorted(unlocks)
	return cell{
		Concurrency:  c,
		Cycles:       len(all),
		Secs:         secs,
		CyclesPerSec: float64(len(all)) / secs,
		P50Us:        quantile(all, 0.50),
		P99Us:        quantile(all, 0.99),
		LockP50Us:    quantile(lock, 0.50),
		LockP99Us:    quantile(lock, 0.99),
		UnlockP50Us:  quantile(unlock, 0.50),
		UnlockP99Us:  quantile(unlock, 0.99),
		Errors:       errors.Load(),
	}
}

// sorted joins every worker's samples, in ascending order.
func sorted(per [][]time.Duration) []time.Duration {
	var all []time.Duration
	for _, s := range per {
		all = append(all, s...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return all
}

// quantile is the nearest-rank percentile, as the Rust side computes it.
func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return float64(sorted[rank-1].Nanoseconds()) / 1e3
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "etcd-lock: "+format+"\n", args...)
	os.Exit(1)
}
