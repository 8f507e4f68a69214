package httpserve

import (
	"context"
	"testing"
	"time"
)

func TestReqCtxCancel(t *testing.T) {
	c := new(reqCtx)
	if c.Err() != nil {
		t.Fatal("Err before cancel")
	}
	done := c.Done()
	child, stopChild := context.WithTimeout(c, time.Hour)
	defer stopChild()
	fired := make(chan struct{})
	context.AfterFunc(c, func() { close(fired) })
	stopped := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
	if !stopped() {
		t.Fatal("stop before cancel reported false")
	}
	select {
	case <-done:
		t.Fatal("Done closed before cancel")
	case <-child.Done():
		t.Fatal("child done before cancel")
	default:
	}
	c.cancel()
	c.cancel() // a second cancel does nothing
	<-done
	<-child.Done() // derived contexts follow
	<-fired
	if c.Err() != context.Canceled || child.Err() != context.Canceled {
		t.Fatalf("Err = %v, child %v", c.Err(), child.Err())
	}
	if stopped() {
		t.Fatal("stop after cancel reported true")
	}
}

func TestReqCtxCancelledFirst(t *testing.T) {
	c := new(reqCtx)
	c.cancel()
	<-c.Done() // made after the cancel: closed
	late := make(chan struct{})
	if stop := context.AfterFunc(c, func() { close(late) }); stop() {
		t.Fatal("stop of an AfterFunc registered after cancel reported true")
	}
	<-late
	child, stop := context.WithCancel(c)
	defer stop()
	<-child.Done()
}
