package keylock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/testutil/harness"
)

func TestSerialisesOneKey(t *testing.T) {
	l := New(time.Minute)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		inside  int
		maxSeen int
	)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := l.Lock(context.Background(), "k")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			inside++
			maxSeen = max(maxSeen, inside)
			mu.Unlock()
			time.Sleep(time.Millisecond) // a holder that keeps the key a moment, so that an overlap would show
			mu.Lock()
			inside--
			mu.Unlock()
			unlock()
		}()
	}
	wg.Wait()
	if maxSeen != 1 {
		t.Fatalf("%d holders at once, want 1", maxSeen)
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("%d slots left after all unlocked, want 0", n)
	}
}

func TestOtherKeysDoNotWait(t *testing.T) {
	l := New(time.Hour)
	unlock, err := l.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u2, err := l.Lock(ctx, "b")
	if err != nil {
		t.Fatalf("lock on another key waited: %v", err)
	}
	u2()
}

func TestBusyKeyAborts(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"no wait", 0, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		{"wait bound", 20 * time.Millisecond, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		{"context deadline", time.Hour, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 20*time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.wait)
			unlock, err := l.Lock(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			if _, err := l.Lock(ctx, "k"); !errors.Is(err, errdefs.ErrAborted) {
				t.Fatalf("second lock: %v, want ErrAborted", err)
			}
			unlock()
			if n := l.Len(); n != 0 {
				t.Fatalf("%d slots left, want 0", n)
			}
			u, err := l.Lock(context.Background(), "k")
			if err != nil {
				t.Fatalf("lock after release: %v", err)
			}
			u()
		})
	}
}

func TestWaiterGetsLockWhenReleased(t *testing.T) {
	l := New(time.Minute)
	unlock, _ := l.Lock(context.Background(), "k")
	got := make(chan error, 1)
	go func() {
		u, err := l.Lock(context.Background(), "k")
		if err == nil {
			u()
		}
		got <- err
	}()
	harness.Eventually(t, 10*time.Second, "the second caller to wait for the key", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.slots["k"].refs == 2
	})
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func BenchmarkUncontended(b *testing.B) {
	l := New(time.Second)
	ctx := context.Background()
	for b.Loop() {
		u, _ := l.Lock(ctx, "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pv/mount")
		u()
	}
}
