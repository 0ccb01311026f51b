// Package backoff is the one exponential backoff of Postern's retry loops.
// It is its own leaf package (no Postern imports) so that the data-type
// packages (services, events) can retry without pulling in lib/utils and
// its network code, which lib/api's leaf rule forbids.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff is the one exponential backoff of Postern's retry loops (tunnel
// agents, resource watchers, audit shipping): Next returns the current
// wait and doubles it up to Max; Reset starts over at Min after a success
// that lasted. With Jitter, each wait is drawn from [d/2, d] so that a
// fleet that lost the same peer at once does not come back in lock step
// (a proxy restart must not see every agent reconnect in the same
// millisecond). Not safe for concurrent use: each loop owns its own.
type Backoff struct {
	// Min is the first wait; Max caps it.
	Min, Max time.Duration
	// Jitter draws each wait from [d/2, d].
	Jitter bool

	cur time.Duration
}

// Next returns the wait before the next attempt and doubles the one after.
func (b *Backoff) Next() time.Duration {
	if b.cur <= 0 {
		b.cur = b.Min
	}
	d := b.cur
	b.cur = min(b.cur*2, b.Max)
	if b.Jitter && d > 1 {
		d = d/2 + rand.N(d/2+1)
	}
	return d
}

// Reset makes the next wait Min again.
func (b *Backoff) Reset() { b.cur = 0 }
