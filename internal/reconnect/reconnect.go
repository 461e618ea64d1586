// Package reconnect holds the reconnect delay the broker clients share.
package reconnect

import (
	"math/rand/v2"
	"time"
)

// Ceiling is the longest delay between two attempts to reach a broker that is down: it
// bounds how late a client notices that the broker is back (the recovery target is a
// relay publishing within 250 ms of its broker's return, and the reconnect is most of it).
const Ceiling = 100 * time.Millisecond

// Delay is the wait before reconnect attempt n (from 0): 25 ms doubling to Ceiling, plus
// up to 25 % jitter so that many relays do not reconnect in step. An attempt against a
// broker that is down costs it one refused connection, so a relay makes about ten a
// second while its broker is away.
func Delay(attempt int) time.Duration {
	d := Ceiling
	if attempt < 2 {
		d = min(d, 25*time.Millisecond<<max(attempt, 0))
	}
	return d + rand.N(d/4+1)
}
