package httpserve

import (
	"net/http"
	"testing"
	"time"
)

func TestAppendDate(t *testing.T) {
	at := time.Date(2026, 11, 21, 20, 30, 5, 0, time.FixedZone("x", 3600))
	want := "Date: " + at.UTC().Format(http.TimeFormat) + "\r\n"
	if got := string(appendDate([]byte("a"), at)); got != "a"+want {
		t.Fatalf("appendDate = %q, want %q", got, "a"+want)
	}
	// Later in the same second: the same line, from the cache.
	if got := string(appendDate(nil, at.Add(999*time.Millisecond))); got != want {
		t.Fatalf("same second: %q, want %q", got, want)
	}
	next := at.Add(time.Second)
	if got, want := string(appendDate(nil, next)), "Date: "+next.UTC().Format(http.TimeFormat)+"\r\n"; got != want {
		t.Fatalf("next second: %q, want %q", got, want)
	}
}
