package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestRelayGateWakes: relays that poll once an hour publish everything writers commit,
// so every message reached them by a wake-up: writers notify only while a relay holds
// the gate, and a relay that finds nothing more asks for it. Writers commit in bursts and
// trickles, some transactions held open between the insert and the commit (the gate is
// busy meanwhile), some rolled back; two relays share the shards, so one holds the gate
// while the other is covered by it. A missed wake-up stalls the test (an hour to the
// next poll): it fails when nothing is published for testenv.Stall().
func TestRelayGateWakes(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	pub := &outboxtest.Publisher{}
	for i := range 2 {
		b.relay(t, nil, pub, outbox.RelayConfig{ID: fmt.Sprintf("r%d", i), PollInterval: time.Hour, LeaseTTL: time.Minute})
	}
	const writers, perWriter = 6, 150
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := 0
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range perWriter {
				msg := outbox.Message{Topic: "t", Key: fmt.Sprintf("w%d-k%d", w, i%5), Payload: []byte(strconv.Itoa(i))}
				rollback := rng.IntN(10) == 0
				ctx, cancel := testenv.CallContext()
				err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
					if err := b.Writer.Write(ctx, tx, msg); err != nil {
						return err
					}
					if rng.IntN(4) == 0 { // held open: relays asking meanwhile find the gate busy
						time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				cancel()
				switch {
				case rollback && err == errRollback:
				case err != nil:
					t.Errorf("writer %d: %v", w, err)
					return
				default:
					mu.Lock()
					committed++
					mu.Unlock()
				}
				if rng.IntN(20) == 0 { // a pause: the relays go idle and ask for the gate
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	got := pub.Await(t, committed)
	b.awaitDrained(t, "all rows marked published")
	if dups, violations := orderCheck(got); violations != 0 || len(got) != committed {
		t.Fatalf("delivered %d of %d committed, %d duplicates, %d out of order", len(got), committed, dups, violations)
	}
}

type rollbackError struct{}

func (rollbackError) Error() string { return "rolled back on purpose" }

var errRollback error = rollbackError{}

// deafStore loses every wake-up of its Listener and answers no ask, as a listener whose
// notifications never arrive would.
type deafStore struct{ *outboxpgx.Driver }

func (s deafStore) Listen(ctx context.Context, _ func(outboxdriver.Wake, int64), _ outboxdriver.Gate) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestRelayLostWakeUpsCostLatencyOnly: a relay that never hears a notification, nor an
// answer about the gate, still publishes everything, at its polls.
func TestRelayLostWakeUpsCostLatencyOnly(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	pub := &outboxtest.Publisher{}
	b.relay(t, deafStore{b.Driver}, pub, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	const n = 60
	for i := range n {
		b.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%4), Payload: []byte(strconv.Itoa(i))})
		if i%10 == 9 {
			pub.Await(t, i+1) // idle between bursts: only a poll finds the next one
		}
	}
	got := pub.Await(t, n)
	if _, violations := orderCheck(got); violations != 0 || len(got) != n {
		t.Fatalf("delivered %d of %d, %d out of order", len(got), n, violations)
	}
}
