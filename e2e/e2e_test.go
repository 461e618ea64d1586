package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

func sharedEnv(t *testing.T) *env {
	js := testnats.JetStream(t, testnats.URL())
	stream, prefix := testnats.Stream(t, js)
	return newEnv(t, testnats.URL(), js, stream, prefix)
}

// TestRelaySIGKILL kills one of two relays mid-stream: nothing is lost, the survivor
// takes the dead relay's shards over within the lease TTL plus one renewal, order holds,
// and duplicates stay within what the dead relay had in flight.
func TestRelaySIGKILL(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	r1 := e.startRelay("r1")
	r2 := e.startRelay("r2")
	waitFor(t, 20*time.Second, "both relays hold shards", func() bool {
		o := e.leaseOwners()
		return o["r1"] > 0 && o["r2"] > 0
	})
	l := e.startLoad(4, 50, 0, 20_000)
	waitFor(t, 30*time.Second, "publishing under way", func() bool { return l.committed.Load() > 5_000 })
	r1.signal(t, syscall.SIGKILL)
	killed := time.Now()
	t.Logf("killed r1 at %s", killed.UTC().Format("15:04:05.000"))
	takeover := waitFor(t, 3*e.ttl, "r2 holds every shard", func() bool { return e.leaseOwners()["r2"] == 64 })
	l.finish()
	e.waitDrained(60 * time.Second)
	rep := e.check(l)
	t.Logf("e2e sigkill %s takeover_s=%.1f lease_ttl_s=%.0f since_kill_s=%.1f", rep, takeover.Seconds(), e.ttl.Seconds(), time.Since(killed).Seconds())
	if rep.lost != 0 || rep.phantom != 0 || rep.order != 0 {
		t.Fatalf("guarantee broken: %s", rep)
	}
	if rep.dup > e.inFlight {
		t.Fatalf("%d duplicates, more than the killed relay's MaxInFlight (%d)", rep.dup, e.inFlight)
	}
	if limit := e.ttl + e.ttl/3 + time.Second; takeover > limit {
		t.Fatalf("takeover took %s, more than the lease TTL plus one renewal (%s)", takeover, limit)
	}
	_ = r2
}

// TestRelaySIGSTOP pauses a relay past its lease while it drains a backlog, lets a
// second relay take over, then resumes it: its late outcomes are refused, order holds,
// nothing is lost.
func TestRelaySIGSTOP(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	e.writeBacklog(30_000, 500)
	e.ackDelay = 200 * time.Millisecond
	a := e.startRelay("a")
	e.ackDelay = 0
	l := e.startLoad(2, 50, 2*time.Millisecond, 0)
	// Freeze a while it drains: it then holds messages in flight or confirmed and not yet
	// recorded, whose outcomes must be refused when it wakes.
	waitFor(t, 60*time.Second, "a drains", func() bool { return e.published() > 5_000 })
	a.signal(t, syscall.SIGSTOP)
	b := e.startRelay("b")
	waitFor(t, 4*e.ttl, "b takes every shard", func() bool { return e.leaseOwners()["b"] == 64 })
	time.Sleep(time.Second)
	a.signal(t, syscall.SIGCONT)
	waitFor(t, 20*time.Second, "a reports its late outcomes refused", func() bool {
		return strings.Contains(a.stderr.String(), `"refused"`)
	})
	time.Sleep(time.Second)
	l.finish()
	e.waitDrained(120 * time.Second)
	rep := e.check(l)
	t.Logf("e2e sigstop %s", rep)
	if rep.lost != 0 || rep.phantom != 0 || rep.order != 0 {
		t.Fatalf("guarantee broken: %s", rep)
	}
	if rep.dup > e.inFlight {
		t.Fatalf("%d duplicates, more than the paused relay's MaxInFlight (%d)", rep.dup, e.inFlight)
	}
	_ = b
}

// TestBrokerDown stops NATS for 30 s (5 s with -short) under load: no attempt is burned,
// nothing is lost, and the relay recovers by itself after the restart.
func TestBrokerDown(t *testing.T) {
	t.Parallel()
	down := 30 * time.Second
	if testing.Short() {
		down = 5 * time.Second
	}
	srv := testnats.StartServer(t)
	prefix := testnats.Unique() + "."
	stream := strings.ToUpper(testnats.Unique())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := outboxnats.Dial(ctx, srv.URL(), outboxnats.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.EnsureStream(ctx, stream, []string{prefix + ">"}); err != nil {
		t.Fatal(err)
	}
	pub.Close()
	e := newEnv(t, srv.URL(), nil, stream, prefix)
	e.startRelay("r")
	l := e.startLoad(2, 50, 5*time.Millisecond, 0)
	waitFor(t, 30*time.Second, "publishing under way", func() bool { return l.committed.Load() > 1_000 })
	srv.Kill()
	downAt := l.committed.Load()
	time.Sleep(down)
	srv.Start()
	restarted := time.Now()
	l.finish()
	recovery := e.waitDrained(2 * time.Minute)
	var attempts, dead int
	q := fmt.Sprintf(`SELECT (SELECT count(*) FROM "%[1]s".outbox_published WHERE attempts > 0), (SELECT count(*) FROM "%[1]s".outbox_dead)`, e.schema)
	if err := e.pool.QueryRow(context.Background(), q).Scan(&attempts, &dead); err != nil {
		t.Fatal(err)
	}
	e.js = testnats.JetStream(t, srv.URL())
	rep := e.check(l)
	t.Logf("e2e broker-down down_s=%.0f written_while_down=%d %s recovery_s=%.1f attempts_burned=%d", down.Seconds(),
		l.committed.Load()-downAt, rep, time.Since(restarted).Seconds(), attempts)
	_ = recovery
	if rep.lost != 0 || rep.phantom != 0 || rep.order != 0 {
		t.Fatalf("guarantee broken: %s", rep)
	}
	if attempts != 0 || dead != 0 {
		t.Fatalf("the outage burned attempts: %d messages with attempts, %d dead", attempts, dead)
	}
}
