// Package clocktest provides Fake, a clock.Clock that stands still until a
// test moves it, so that code which waits, expires or stamps can be tested
// without sleeping.
//
// A typical test starts the code under test on a Fake, waits with
// BlockUntilWaiters until that code has armed the timer it is going to
// wait on, and then calls Advance:
//
//	clk := clocktest.NewFake(time.Unix(0, 0))
//	go worker(ctx, clk) // arms clk.NewTimer(time.Minute) and waits on it
//	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
//		t.Fatal(err)
//	}
//	clk.Advance(time.Minute - time.Nanosecond) // nothing fires
//	clk.Advance(time.Nanosecond)               // the worker's timer fires
//
// Advance and Set fire timers in deadline order and return only after every
// AfterFunc callback they launched has returned, so a test can check the
// effects of callbacks straight after the call. A goroutine woken through a
// timer's channel runs on its own schedule; a test learns that it has
// finished its work from that work's own effects (a value on a channel, a
// timer re-armed as seen by BlockUntilWaiters).
//
// A count of timers can mislead when the code holds different timers at
// different moments: a health check probing holds its timeout, and its
// interval timer only once the probe is over. BlockUntil waits on the
// pending deadlines themselves:
//
//	// the check has re-armed its one-minute interval, and holds no timeout
//	err := clk.BlockUntil(ctx, func(now time.Time, due []time.Time) bool {
//		return len(due) == 1 && due[0].Equal(now.Add(time.Minute))
//	})
package clocktest
