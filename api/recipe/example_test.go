package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/api/recipe"
	"github.com/holdfast/holdfast/internal/servertest"
)

// exampleServer starts an in-process holdfast server for the examples and
// returns a client for it. Real programs make their client with
// api.NewClient(nil), which reads HOLDFAST_HTTP_ADDR.
func exampleServer() (*api.Client, func()) {
	tb := &exampleTB{}
	srv := servertest.New(tb, servertest.Options{})
	client, err := api.NewClient(&api.Config{Address: srv.Addr})
	if err != nil {
		log.Fatal(err)
	}
	return client, tb.cleanup
}

// exampleTB is just enough of a testing.TB for servertest outside a test.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()                           {}
func (*exampleTB) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }
func (*exampleTB) Log(args ...any)                   {}
func (tb *exampleTB) Cleanup(f func())               { tb.cleanups = append(tb.cleanups, f) }
func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

func ExampleNewSession() {
	client, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	// A session of TTL 10s, renewed every 5s by its keeper. It is Lost at
	// the latest 10s minus 150ms after the last renew that succeeded was
	// sent (the safe deadline), before the server can free its locks.
	// LoseOnLost keeps its holds through a failed renew or two.
	sess, err := recipe.NewSession(ctx, client, &recipe.SessionOptions{
		Name:   "billing worker",
		TTL:    10 * time.Second,
		Policy: recipe.LoseOnLost,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)

	events := sess.Listen(ctx)
	go func() {
		for ev := range events {
			// Connected, Suspended, Reconnected, Lost, in order. Do not
			// block here for long: the events queue up meanwhile.
			log.Printf("session %s: %v (%v)", sess.ID(), ev.State, ev.Err)
		}
	}()
	fmt.Println(sess.State(), sess.TTL())
	// Output: Connected 10s
}

func ExampleLock() {
	client, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	sess, err := recipe.NewSession(ctx, client, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)

	lock, err := recipe.NewLock(sess, "service/billing/leader", &recipe.LockOptions{Value: []byte("worker-7")})
	if err != nil {
		log.Fatal(err)
	}
	hold, err := lock.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	seq := hold.Sequencer()
	fmt.Println("holding", seq.Key, "at lock index", seq.LockIndex)

	// Guard every write with the sequencer: the server refuses it once
	// the hold is no longer current, however long this process was paused.
	ok, _, err := client.KV().PutFenced(ctx, &api.KVPair{Key: "service/billing/run", Value: []byte("42")}, seq, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("fenced write accepted:", ok)

	select {
	case <-hold.Lost():
		// Stop working at once: someone else may hold the lock now.
		fmt.Println("lost:", hold.Err())
	default:
	}
	if err := hold.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	<-hold.Lost() // closed by Unlock too
	fmt.Println("released")
	// Output:
	// holding service/billing/leader at lock index 1
	// fenced write accepted: true
	// released
}

func ExampleLock_TryLock() {
	client, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	var locks []*recipe.Lock
	for i := 0; i < 2; i++ {
		sess, err := recipe.NewSession(ctx, client, nil)
		if err != nil {
			log.Fatal(err)
		}
		defer sess.Close(ctx)
		l, err := recipe.NewLock(sess, "cron/nightly", nil)
		if err != nil {
			log.Fatal(err)
		}
		locks = append(locks, l)
	}
	if _, err := locks[0].TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	_, err := locks[1].TryLock(ctx)
	fmt.Println(errors.Is(err, recipe.ErrLocked))
	// Output: true
}

func ExampleSemaphore() {
	client, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	// Three workers, two slots.
	var sems []*recipe.Semaphore
	for i := 0; i < 3; i++ {
		sess, err := recipe.NewSession(ctx, client, &recipe.SessionOptions{Behavior: api.SessionBehaviorDelete})
		if err != nil {
			log.Fatal(err)
		}
		defer sess.Close(ctx)
		sem, err := recipe.NewSemaphore(sess, "service/encoder/slots", 2, nil)
		if err != nil {
			log.Fatal(err)
		}
		sems = append(sems, sem)
	}
	first, err := sems[0].Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sems[1].Acquire(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = sems[2].TryAcquire(ctx)
	fmt.Println(err)

	got := make(chan *recipe.Permit)
	go func() {
		p, err := sems[2].Acquire(ctx) // waits for a free slot
		if err != nil {
			log.Fatal(err)
		}
		got <- p
	}()
	if err := first.Release(ctx); err != nil {
		log.Fatal(err)
	}
	p := <-got
	fmt.Println("third worker got a slot:", p.Sequencer().Key)
	// Output:
	// recipe: every slot of the semaphore is taken
	// third worker got a slot: service/encoder/slots/.lock
}

func ExampleElection() {
	client, stop := exampleServer()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var sessions []*recipe.Session
	defer func() {
		for _, s := range sessions {
			s.Close(context.Background())
		}
	}()
	newElection := func() *recipe.Election {
		sess, err := recipe.NewSession(ctx, client, nil)
		if err != nil {
			log.Fatal(err)
		}
		sessions = append(sessions, sess)
		e, err := recipe.NewElection(sess, "service/scheduler/leader")
		if err != nil {
			log.Fatal(err)
		}
		return e
	}
	observer := newElection().Observe(ctx)
	show := func() {
		ld := <-observer
		if ld.Vacant {
			fmt.Println("no leader")
			return
		}
		fmt.Printf("leader %s (term %d)\n", ld.Value, ld.Sequencer.LockIndex)
	}
	show()

	a, b := newElection(), newElection()
	term, err := a.Campaign(ctx, []byte("10.0.0.1:8080"))
	if err != nil {
		log.Fatal(err)
	}
	show()
	next := make(chan *recipe.Leadership)
	go func() {
		t, err := b.Campaign(ctx, []byte("10.0.0.2:8080")) // waits its turn
		if err != nil {
			log.Fatal(err)
		}
		next <- t
	}()
	if err := term.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	show()
	show()
	<-next
	// Output:
	// no leader
	// leader 10.0.0.1:8080 (term 1)
	// no leader
	// leader 10.0.0.2:8080 (term 2)
}
