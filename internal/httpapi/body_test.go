package httpapi

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// readAll must return what io.ReadAll returns, whatever the declared
// length says: right, too short, too long, unknown.
func TestReadAllMatchesIOReadAll(t *testing.T) {
	for _, body := range []string{"", "x", strings.Repeat("v", 511), strings.Repeat("v", 512), strings.Repeat("w", 5000)} {
		for _, n := range []int64{-1, 0, 1, int64(len(body)), int64(len(body)) + 7, int64(len(body)) / 2} {
			for _, half := range []bool{false, true} {
				mk := func() io.Reader {
					var r io.Reader = strings.NewReader(body)
					if half {
						r = iotest.HalfReader(r)
					}
					return r
				}
				want, werr := io.ReadAll(mk())
				got, gerr := readAll(mk(), n)
				if !bytes.Equal(got, want) || (gerr == nil) != (werr == nil) || got == nil {
					t.Fatalf("len %d n %d half %v: got %d bytes, %v; want %d bytes, %v", len(body), n, half, len(got), gerr, len(want), werr)
				}
			}
		}
	}
	// A truncated body fails as io.ReadAll fails.
	_, err := readAll(iotest.TimeoutReader(strings.NewReader("abc")), 10)
	if err == nil {
		t.Fatal("error from the reader was dropped")
	}
}

// readAllMax must return what readAll over an io.LimitReader returns.
func TestReadAllMaxMatchesLimitReader(t *testing.T) {
	for _, body := range []string{"", "x", strings.Repeat("v", 511), strings.Repeat("v", 512), strings.Repeat("w", 5000)} {
		for _, n := range []int64{-1, 0, 1, int64(len(body)), int64(len(body)) + 7, int64(len(body)) / 2} {
			for _, limit := range []int64{1, 2, 511, 512, 513, int64(len(body)), int64(len(body)) + 1, 100000} {
				for _, half := range []bool{false, true} {
					mk := func() io.Reader {
						var r io.Reader = strings.NewReader(body)
						if half {
							r = iotest.HalfReader(r)
						}
						return r
					}
					want, werr := readAll(io.LimitReader(mk(), limit), n)
					got, gerr := readAllMax(mk(), n, limit)
					if !bytes.Equal(got, want) || (gerr == nil) != (werr == nil) || got == nil {
						t.Fatalf("len %d n %d limit %d half %v: got %d bytes, %v; want %d bytes, %v", len(body), n, limit, half, len(got), gerr, len(want), werr)
					}
				}
			}
		}
	}
}
