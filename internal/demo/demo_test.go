package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

func run(t *testing.T, cfg Config) (Result, string) {
	t.Helper()
	out := &testenv.Buffer{}
	cfg.Out = out
	ctx, cancel := context.WithCancel(context.Background())
	var res Result
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = Run(ctx, cfg)
	}()
	t.Cleanup(func() { cancel(); <-done })
	// The demo prints its counts (written, published, handled) every 500 ms: the same
	// line for testenv.Stall() means it stopped moving.
	testenv.AwaitChan(t, "the demo to handle every committed event", done, func() any { return lastLine(out.String()) })
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if !res.OK() || res.Committed == 0 || res.RolledBack == 0 || res.Redeliveries == 0 {
		t.Fatalf("demo result %+v\n%s%s", res, out.String(), res.Summary())
	}
	s := res.Summary()
	if strings.Contains(s, "FAIL") {
		t.Fatalf("summary reports a failure:\n%s", s)
	}
	// The relay's own latency, timed by its observer: every committed event was
	// confirmed by the broker at least once.
	if res.Published < res.Committed {
		t.Errorf("the relay's observer saw %d confirmations, want at least the %d committed events", res.Published, res.Committed)
	}
	// Acks were lost after the work committed, and every such event came back and was
	// skipped by the inbox.
	if res.LostAcks == 0 || res.Redeliveries < res.LostAcks {
		t.Errorf("%d acks lost, %d redeliveries skipped by the inbox; want some lost, each skipped", res.LostAcks, res.Redeliveries)
	}
	for _, want := range []string{
		"latency commit -> published: p50 ",
		"latency commit -> handled:   p50 ",
		fmt.Sprintf("%d acks lost after the work committed, %d redeliveries skipped, 0 extra effects", res.LostAcks, res.Redeliveries),
		"\nnext: ",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if !strings.Contains(out.String(), "p99 commit -> published ") {
		t.Errorf("progress lines lack the relay's latency:\n%s", out.String())
	}
	return res, s
}

// The embedded default: SQLite files and an in-process NATS server. With --dir the files
// stay, and the summary ends with the command that shows the outbox they hold; a second
// run on the same directory works too.
func TestDemoEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, summary := run(t, Config{Orders: 400, Rollback: 0.2, Crash: 0.2, Dir: dir})
	want := "next: outbox status --database-url sqlite://" + filepath.ToSlash(filepath.Join(dir, "orders.db")) + "\n"
	if !strings.Contains(summary, want) {
		t.Errorf("summary lacks %q:\n%s", want, summary)
	}
	run(t, Config{Orders: 100, Rollback: 0.2, Crash: 0.2, Dir: dir})
}

// Without --dir, the files go, and the summary says how to keep them.
func TestDemoTemporary(t *testing.T) {
	t.Parallel()
	_, summary := run(t, Config{Orders: 100, Rollback: 0.2, Crash: 0.2, Command: "go run ./cmd/outbox"})
	if !strings.Contains(summary, "next: go run ./cmd/outbox demo --dir ") {
		t.Errorf("summary does not say how to keep the databases:\n%s", summary)
	}
}

// PostgreSQL instead of SQLite.
func TestDemoPostgres(t *testing.T) {
	t.Parallel()
	run(t, Config{Orders: 400, Rollback: 0.2, Crash: 0.2, DatabaseURL: testdb.URL(), Dir: t.TempDir()})
}

// An event can be handled before the goroutine that committed it is told the commit
// returned: it still counts as delivered, in order, with its latency.
func TestTrackerHandledBeforeCommitReturned(t *testing.T) {
	tr := newTracker()
	events := []outbox.Message{{ID: outbox.NewID(), Key: "order-1"}, {ID: outbox.NewID(), Key: "order-1"}}
	tr.placing(events, false)
	for _, m := range events {
		tr.handled(&outbox.Delivery{ID: m.ID.String(), Key: m.Key}, true)
	}
	tr.written(events, false, time.Now())
	r := tr.result()
	if r.Committed != 2 || r.Delivered != 2 || r.OrderViolations != 0 || !tr.complete() || len(tr.latencies) != 2 {
		t.Fatalf("result %+v, %d latencies; want 2 committed and delivered, in order, 2 latencies", r, len(tr.latencies))
	}
	// A rolled-back event handled is caught, whenever its transaction ends.
	rb := []outbox.Message{{ID: outbox.NewID(), Key: "order-2"}}
	tr.placing(rb, true)
	tr.handled(&outbox.Delivery{ID: rb[0].ID.String(), Key: "order-2"}, true)
	tr.written(rb, true, time.Now())
	if r := tr.result(); r.DeliveredRB != 1 || r.OK() {
		t.Fatalf("result %+v; want the rolled-back event counted as handled, and not OK", r)
	}
}
