package cli

import "testing"

func TestProcsFloor(t *testing.T) {
	for _, c := range []struct {
		cur, least int
		env        bool
		want       int
	}{
		{1, 2, false, 2},
		{2, 2, false, 2},
		{8, 2, false, 8},
		{1, 2, true, 1}, // the operator chose it
	} {
		if got := procsFloor(c.cur, c.least, c.env); got != c.want {
			t.Errorf("procsFloor(%d, %d, %v) = %d, want %d", c.cur, c.least, c.env, got, c.want)
		}
	}
}
