// client-go's Lease leader election (k8s.io/client-go/tools/leaderelection with a LeaseLock), the
// peer people use instead of podlock, for bench/handoff's failover rows.
//
//	lease-election -kubeconfig PATH -namespace NS -name LEASE -id ID [-lease-seconds L]
//	               [-renew-seconds R] [-retry-seconds P] candidate
//
// A candidate campaigns for the Lease NS/LEASE as ID; when it leads it prints one line
// "LEADER <id> <unix ns>" and leads until killed (SIGTERM: releases the Lease first). By default
// RenewDeadline is 2/3 L and RetryPeriod L/5 (client-go's 15/10/2 s is L=15 with a 3 s retry);
// client-go requires L > R > 1.2 P, and the Lease records L in whole seconds. The leader renews
// every P; another candidate polls every P to 2.2 P (client-go's jitter) and takes over once the
// Lease has not changed for L since it last saw it change: after a kill -9 of the leader, that
// is about L, give or take up to about 2 P.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "default", "the Lease's namespace")
	name := flag.String("name", "bench", "the Lease's name")
	id := flag.String("id", "", "this candidate's identity")
	lease := flag.Int("lease-seconds", 15, "LeaseDuration (whole seconds, as the Lease records it)")
	renew := flag.Float64("renew-seconds", 0, "RenewDeadline (default 2/3 of -lease-seconds)")
	retry := flag.Float64("retry-seconds", 0, "RetryPeriod (default 1/5 of -lease-seconds)")
	klog.InitFlags(nil) // klog's -v etc.; verbosity 0, to stderr
	flag.Parse()
	if flag.Arg(0) != "candidate" || *id == "" {
		fail(errors.New("usage: lease-election -kubeconfig PATH -namespace NS -name LEASE -id ID [-lease-seconds L] [-renew-seconds R] [-retry-seconds P] candidate"))
	}
	if *renew == 0 {
		*renew = float64(*lease) * 2 / 3
	}
	if *retry == 0 {
		*retry = float64(*lease) / 5
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	fail(err)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *name},
		Client:     kubernetes.NewForConfigOrDie(cfg).CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *id},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   time.Duration(*lease) * time.Second,
		RenewDeadline:   seconds(*renew),
		RetryPeriod:     seconds(*retry),
		ReleaseOnCancel: true,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				fmt.Printf("LEADER %s %d\n", *id, time.Now().UnixNano()) // stdout is unbuffered
			},
			OnStoppedLeading: func() {},
		},
	})
	fail(err) // e.g. durations that break L > R > 1.2 P
	// Run returns when the context is cancelled (after releasing the Lease) or the lead is lost.
	le.Run(ctx)
	if ctx.Err() == nil {
		fail(fmt.Errorf("lost the Lease %s/%s", *namespace, *name))
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
