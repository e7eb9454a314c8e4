package main

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestMedianRatioCI: the interval holds 1 for two samples of one
// distribution and the true ratio, not 1, for a distribution twice as
// slow.
func TestMedianRatioCI(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	draw := func(scale float64) []time.Duration {
		out := make([]time.Duration, 500)
		for i := range out {
			out[i] = time.Duration(scale * (20_000 + rng.ExpFloat64()*5_000))
		}
		return out
	}
	a, b := draw(1), draw(1)
	if lo, hi, ok := medianRatioCI(a, b); !ok || lo > 1 || hi < 1 {
		t.Errorf("one distribution: CI %.3f-%.3f (ok %v), want it to hold 1", lo, hi, ok)
	}
	if lo, hi, ok := medianRatioCI(draw(2), b); !ok || lo <= 1 || lo > 2 || hi < 2 {
		t.Errorf("twice as slow: CI %.3f-%.3f (ok %v), want it to hold 2 and not 1", lo, hi, ok)
	}
	if _, _, ok := medianRatioCI(nil, b); ok {
		t.Error("no samples: a CI")
	}
}
