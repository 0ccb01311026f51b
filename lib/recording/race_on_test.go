//go:build race

package recording

// raceEnabled: the race detector slows byte loops about tenfold.
const raceEnabled = true
