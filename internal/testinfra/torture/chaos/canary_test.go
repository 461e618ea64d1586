//go:build outbox_broken

package chaos

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
)

// TestCanaries runs relays with one deliberate bug each (package broken) through a short
// torture run and asserts that the checker catches it: a suite that passes a broken relay
// proves nothing. Each canary uses the fault kinds and relay count that expose its bug;
// none depends on the seed (replay one with OUTBOX_TORTURE_SEED).
//
// broken.LocalClockLeases breaks no delivery guarantee: fetching and recording are
// fenced by the lease's owner and token in the database, so a relay that takes a shard
// too early leaves the old owner only duplicates, which NATS drops by Nats-Msg-Id. It is
// caught by the runner's lease check: no shard changes owner while its owner's heartbeat
// is live in database time.
//
//	go test -tags outbox_broken -run TestCanaries ./internal/torture/chaos
func TestCanaries(t *testing.T) {
	for _, c := range []struct {
		bug    broken.Bug
		cfg    Config
		want   string // what the checker must report, for the failure message
		caught func(torture.Report) bool
		runs   int // runs before the canary counts as missed (default 3)
		// onDemand: run only with OUTBOX_TORTURE_FULL=1, since the in-memory canaries
		// (relay_mem_test.go, scripts/test.sh) catch the bug in every run of the test
		// command, in seconds.
		onDemand bool
	}{{
		// Outcomes an outage left unknown (cut, restart) are recorded as published.
		// Poison recorded as published is lost too; count only the rest.
		bug:    broken.MarkBeforeConfirm,
		cfg:    Config{Relays: 1, Kinds: []string{KindBrokerRestart, KindBrokerCut}},
		want:   "lost events beyond the poison ones",
		caught: func(r torture.Report) bool { return r.Lost > r.PoisonAlive },
	}, {
		// A transaction that commits after a later one (a long transaction, or just a
		// concurrent one) lands below the cursor and is never fetched, nor is the rest of
		// its key. A relay restart would rescan from the start, so no relay kill. The
		// drain cannot succeed: it ends as in every run, when the pending count has not
		// gone down for DrainStall, and no sooner, so that the events reported lost are
		// stuck for good and not merely slow: over two minutes, hence on demand.
		bug:      broken.CursorPolling,
		cfg:      Config{Relays: 1, Kinds: []string{KindPGTerminate, KindBrokerCut}},
		want:     "lost events",
		caught:   func(r torture.Report) bool { return r.Lost > 0 },
		onDemand: true,
	}, {
		// Messages of one key go out in parallel batches, and from every relay at once:
		// a later one overtakes an earlier one. Faults make the backlogs that fill
		// parallel batches. About two runs in five bite here (4 of 8 on 2026-11-25), and
		// CI once missed it in 3: hence more runs.
		bug:    broken.NoKeyGate,
		cfg:    Config{Relays: 3, Kinds: []string{KindBrokerCut, KindRelayStop}},
		want:   "order violations",
		caught: func(r torture.Report) bool { return r.Order > 0 },
		runs:   10,
	}, {
		// Every relay runs a minute ahead of the database: a paused or killed relay's
		// shards are taken after the TTL by the relays' clocks, a minute early in
		// database time.
		bug: broken.LocalClockLeases,
		cfg: Config{Relays: 3, Kinds: []string{KindRelayKill, KindRelayStop},
			RelayEnv: []string{pgsql.SkewVar + "=1m"}},
		want:   "lease steals",
		caught: func(r torture.Report) bool { return r.LeaseSteals > 0 },
	}, {
		// A retired bucket of the pending ring is truncated with its pending rows in
		// it. A broker cut leaves a backlog spread over buckets small enough to reclaim.
		// Rows in the relay's hand survive the truncation (it publishes them from
		// memory once the broker is back), so the relay may hold few: the backlog stays
		// in the buckets. (Holding 1,500, it took in all of a cut's backlog in CI's
		// three runs once.)
		bug:    broken.TruncateStragglers,
		cfg:    Config{Relays: 1, Kinds: []string{KindBrokerCut}, MaxInFlight: 20, BatchSize: 20},
		want:   "lost events",
		caught: func(r torture.Report) bool { return r.Lost > 0 },
	}, {
		// WAL mode acknowledges each transaction as it arrives: nothing is lost (the rows
		// stay in the outbox), but the slot moves past messages not yet published, which
		// the slot audit sees. Broker cuts keep messages unpublished for a while.
		bug:    broken.WALAckOnReceipt,
		cfg:    Config{Relays: 1, WAL: true, Kinds: []string{KindBrokerCut}},
		want:   "slot acknowledged ahead of a record",
		caught: func(r torture.Report) bool { return r.SlotAhead > 0 },
	}, {
		// WAL mode acknowledges the latest resolved transaction with earlier ones not
		// resolved: a broker cut leaves a backlog whose keys resolve out of commit order.
		bug:    broken.WALAckMax,
		cfg:    Config{Relays: 1, WAL: true, Kinds: []string{KindBrokerCut}},
		want:   "slot acknowledged ahead of a record",
		caught: func(r torture.Report) bool { return r.SlotAhead > 0 },
	}, {
		// WAL mode starts reading at the server's current position: what committed while
		// the stream was down (a relay killed, the database cut off) is skipped by the
		// stream and acknowledged with what comes next, while the catch-up fetch is still
		// publishing it. It bites only when the stream restarts before polling (which
		// takes over while the stream is down) has recorded those messages: in about one
		// run of two here, hence more runs.
		bug:    broken.WALStartAtCurrent,
		cfg:    Config{Relays: 1, WAL: true, Kinds: []string{KindDBCut, KindRelayKill}},
		want:   "slot acknowledged ahead of a record",
		caught: func(r torture.Report) bool { return r.SlotAhead > 0 },
		runs:   8,
	}, {
		// WAL mode publishes every fresh row from the log, before its catch-up and
		// whatever its key holds back: a row the broker cut left to a retry is overtaken
		// by the next row of its key.
		bug:    broken.WALTrustAll,
		cfg:    Config{Relays: 1, WAL: true, Kinds: []string{KindBrokerCut, KindRelayKill}},
		want:   "order violations",
		caught: func(r torture.Report) bool { return r.Order > 0 },
		runs:   6, // it bit in 2 of 4 runs on 2026-11-30
	}, {
		// A relay serving an outboxes list publishes every outbox's messages with one
		// route: they reach the first outbox's destination. No fault is needed.
		bug:    broken.FleetOneRoute,
		cfg:    Config{Relays: 2, Outboxes: 3, Kinds: []string{KindPGSnapshot}},
		want:   "copies in another outbox's destination",
		caught: func(r torture.Report) bool { return r.Crossed > 0 },
	}, {
		// A routing rule on the aggregate type matches every message: the keys NATS
		// should get reach RabbitMQ. No fault is needed.
		bug:    broken.RouteTopicOnly,
		cfg:    Config{Broker: "destinations", Relays: 1, Kinds: []string{KindPGSnapshot}},
		want:   "copies in another destination than their rule names",
		caught: func(r torture.Report) bool { return r.Misrouted > 0 },
		runs:   1,
	}} {
		t.Run(string(c.bug), func(t *testing.T) {
			if full, _ := strconv.ParseBool(os.Getenv("OUTBOX_TORTURE_FULL")); c.onDemand && !full {
				t.Skip("on demand (OUTBOX_TORTURE_FULL=1): the in-memory canaries catch this bug in every run")
			}
			// A run catches a canary only if its faults happen to make the bug bite (a
			// backlog in parallel batches, stragglers in a retired bucket), which faster
			// recovery makes rarer: a canary is caught if any of a few runs, each with
			// its own seed, catches it. A suite that never does still fails.
			runs := cmp.Or(c.runs, 3)
			var seeds []uint64
			for range runs {
				cfg := c.cfg
				cfg.Seed = seed(t)
				if len(seeds) > 0 {
					cfg.Seed = seeds[len(seeds)-1] + 1
				}
				seeds = append(seeds, cfg.Seed)
				cfg.Artifacts = artifacts(t)
				cfg.Duration = 15 * time.Second
				cfg.RelayEnv = append([]string{broken.EnvVar + "=" + string(c.bug)}, cfg.RelayEnv...)
				rep := Run(t, cfg)
				rep.Label = "canary " + string(c.bug) + " " + rep.Label
				t.Log(rep.String())
				fmt.Println(rep.String())
				if !rep.OK() && c.caught(rep) {
					return
				}
			}
			t.Errorf("canary %s not caught in %d runs: want %s (replay with OUTBOX_TORTURE_SEED=%v)", c.bug, runs, c.want, seeds)
		})
	}
}
