package loadbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPairedRatio: the keyed scenarios' CPU against their twins' is taken round by round (proxy
// and Postgres together), then the median of those ratios; rounds missing on either side give
// no ratio.
func TestPairedRatio(t *testing.T) {
	c := func(proxy, postgres time.Duration) cpuCost {
		return cpuCost{proxy * time.Microsecond, postgres * time.Microsecond}
	}
	// Rounds: 1.10x, 0.90x, 1.02x: the median is 1.02 (the medians of each side, 220 and 200,
	// would give 1.10).
	r, ok := pairedRatio([]cpuCost{c(200, 20), c(90, 0), c(300, 6)}, []cpuCost{c(180, 20), c(100, 0), c(290, 10)})
	require.True(t, ok)
	require.InDelta(t, 1.02, r, 1e-9)
	r, ok = pairedRatio([]cpuCost{c(110, 0), c(130, 0)}, []cpuCost{c(100, 0), c(100, 0)})
	require.True(t, ok)
	require.InDelta(t, 1.2, r, 1e-9, "of two rounds, the mean of both")
	_, ok = pairedRatio([]cpuCost{c(110, 0)}, []cpuCost{c(100, 0), c(100, 0)})
	require.False(t, ok)
	_, ok = pairedRatio(nil, nil)
	require.False(t, ok)
}

// TestRoundRatios: each round's ratio, in the rounds' order, printed two decimals each.
func TestRoundRatios(t *testing.T) {
	c := func(proxy time.Duration) cpuCost { return cpuCost{proxy: proxy * time.Microsecond} }
	r := roundRatios([]cpuCost{c(110), c(95)}, []cpuCost{c(100), c(100)})
	require.InDeltaSlice(t, []float64{1.1, 0.95}, r, 1e-9)
	require.Equal(t, "1.10, 0.95", ratios(r))
	require.Nil(t, roundRatios([]cpuCost{c(1)}, []cpuCost{c(0)}), "a round without CPU on the side compared to")
}

// TestDBCPUSince: a paired scenario's Postgres CPU is what its database's backends used between
// the samples, a backend that began meanwhile counted whole.
func TestDBCPUSince(t *testing.T) {
	ms := time.Millisecond
	before := map[int]time.Duration{10: 50 * ms, 11: 70 * ms, 12: 5 * ms}
	after := map[int]time.Duration{10: 80 * ms, 11: 70 * ms, 13: 20 * ms} // 12 ended, 13 began
	require.Equal(t, 50*ms, dbCPUSince(before, after))
	require.Zero(t, dbCPUSince(nil, nil))
}
