package console

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// chromiumPath is Debian's Chromium, which the browser test drives.
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium with a fresh profile, closed when the test ends,
// and returns a context whose actions drive its first tab. The context has no deadline:
// each step (run, text, read) bounds its own hang by testenv.Stall(), so a slow machine
// makes the test long, never failed.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("the browser test needs Chromium at %s: apt-get install chromium (scripts/test.sh installs it): %v", chromiumPath, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("mute-audio", true),
		chromedp.WindowSize(1280, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first action starts the browser, which lives as long as that action's context:
	// ctx itself, then. Its hang is bounded from here; the cleanup ends it.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	if err := testenv.AwaitRecv(t, "Chromium to start", started); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	return ctx
}

// step returns a context for one step in the browser: the hang bound, testenv.Stall(),
// released when the step is done.
func step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, testenv.Stall())
}

// text returns the text of the first element matching the CSS selector.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	ctx, cancel := step(ctx)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := step(ctx)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// click clicks the element and waits for the page it leads to to load, so that what
// the test reads next is on the new page, not the old one.
func click(sel string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel)))(ctx, tg)
		return chromedp.Void{}, err
	}
}

// TestBrowserReplaysDeadLetter drives the console in headless Chromium the way an
// operator would: log in, read the overview, open the dead letters, filter them by
// topic, replay one through the confirmation step, and see the relay publish it.
func TestBrowserReplaysDeadLetter(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	dead := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"order":1}`)}
	other := outbox.Message{ID: outbox.NewID(), Topic: "billing", Key: "b-1", EventType: "invoice.sent", Payload: []byte(`{"invoice":1}`)}
	live := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "o-2", Payload: []byte(`{"order":2}`)}
	db.Write(t, dead, other)
	db.Kill(t, dead.ID, 10, "nats: no responders available for request", time.Hour)
	db.Kill(t, other.ID, 10, "webhook: 410 Gone", 30*time.Minute)

	relay, pub := startRelay(t, db, "browser-relay")
	db.Write(t, live)
	pub.Await(t, 1)
	b := serve(t, db, Config{Token: testToken, RelayID: relay.ID(), RelayStats: relay.Stats, Refresh: 2 * time.Second})

	bctx := browser(t)

	// The overview asks for the token first, then shows the outbox.
	run(t, bctx, "open the console and log in",
		chromedp.Navigate(b.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), testToken),
		click("#login"),
		chromedp.WaitVisible(chromedp.CSS(`[data-stat="dead"]`)),
	)
	if got := text(t, bctx, `[data-stat="dead"]`); got != "2" {
		t.Errorf("overview shows %s dead letters, want 2", got)
	}
	if got := text(t, bctx, `tr[data-relay="browser-relay"]`); !strings.Contains(got, "this relay") || !strings.Contains(got, "live") {
		t.Errorf("overview's relay row: %q", got)
	}

	// The dead letters, filtered by topic.
	run(t, bctx, "open the dead letters",
		click(`nav a[href="/dead"]`),
		chromedp.WaitVisible(chromedp.CSS("#filters")),
	)
	if got := text(t, bctx, "#summary"); got != "2 dead letters." {
		t.Errorf("unfiltered summary: %q", got)
	}
	run(t, bctx, "filter by topic",
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="topic"]`), "orders"),
		click("#apply"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-id="`+dead.ID.String()+`"]`)),
	)
	if got := text(t, bctx, "#summary"); got != `1 dead letter match topic="orders".` {
		t.Errorf("filtered summary: %q", got)
	}
	ectx, cancel := step(bctx)
	defer cancel()
	rows, err := chromedp.Run(ectx, chromedp.Evaluate[int](`document.querySelectorAll("tr[data-id]").length`))
	if err != nil {
		t.Fatalf("count the rows: %v", err)
	}
	if rows != 1 {
		t.Errorf("the filtered list has %d rows, want 1", rows)
	}

	// Replay it: the button leads to a confirmation, and only its button acts.
	run(t, bctx, "select and ask to replay",
		chromedp.Click(chromedp.CSS(`input[name="id"][value="`+dead.ID.String()+`"]`)),
		click("#replay-selected"),
		chromedp.WaitVisible(chromedp.CSS("#confirm-text")),
	)
	if got := text(t, bctx, "#confirm-text"); got != "You are about to replay 1 dead letter matching id="+dead.ID.String()+"." {
		t.Errorf("confirmation: %q", got)
	}
	if n := db.CountIn(t, "outbox_dead", "true"); n != 2 {
		t.Fatalf("%d dead letters before confirming, want 2", n)
	}
	run(t, bctx, "confirm",
		click("#confirm"),
		chromedp.WaitVisible(chromedp.CSS("#done")),
	)
	if got := text(t, bctx, "#done"); !strings.HasPrefix(got, "Replayed 1 dead letter:") {
		t.Errorf("result: %q", got)
	}
	if got := text(t, bctx, "#summary"); got != `No dead letters match topic="orders".` {
		t.Errorf("summary after the replay: %q", got)
	}

	// The relay publishes it, with its original id.
	msgs := pub.Await(t, 2)
	if !slices.ContainsFunc(msgs, func(m outbox.Message) bool { return m.ID == dead.ID && string(m.Payload) == string(dead.Payload) }) {
		t.Errorf("published %d messages, none the replayed one", len(msgs))
	}

	// The overview, refreshing itself, shows one dead letter left and two published.
	run(t, bctx, "back to the overview", click(`nav a[href="/"]`), chromedp.WaitVisible(chromedp.CSS(`[data-stat="dead"]`)))
	// A read can meet the page's reload and then wait for nothing: each read gives up
	// after a while and the next one tries again. That while doubles each time a read
	// gives up, so a machine too slow for it gets reads long enough.
	var seen string
	attempt := 5 * time.Second
	testenv.Await(t, "the overview to show the replayed message published", func() (any, bool) {
		tctx, cancel := context.WithTimeout(bctx, attempt)
		defer cancel()
		dead, err1 := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(`[data-stat="dead"]`)))
		published, err2 := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(`[data-stat="relay-published"]`)))
		if tctx.Err() != nil {
			attempt = min(2*attempt, testenv.Stall())
		}
		seen = dead + " dead, " + published + " published"
		if err1 != nil || err2 != nil {
			seen += " (a read failed)"
		}
		return seen, err1 == nil && err2 == nil && dead == "1" && published == "2"
	})
	t.Logf("overview: %s", seen)
}

// TestBrowserOverviewCharts: the overview's last-hour charts, as Chromium renders them:
// one line per chart with a point per reading the console took, drawn with a width, and
// the highest and latest values beside it.
func TestBrowserOverviewCharts(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	b := serve(t, db, Config{Refresh: -1})
	clock := time.Now()
	b.h.now = func() time.Time { return clock }
	ctx := context.Background()
	for i, n := range []int{3, 2, 0} { // pending 3, then 5, then 5
		for range n {
			db.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprint(i), Payload: []byte(`1`)})
		}
		b.h.sample(ctx)
		clock = clock.Add(sampleEvery)
	}

	bctx := browser(t)
	run(t, bctx, "open the overview", chromedp.Navigate(b.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="pending"]`)))
	for key, want := range map[string]struct {
		points    string
		max, last string
	}{
		"pending":    {"4", "5", "5"}, // the page load reads once more
		"throughput": {"3", "0/s", "0/s"},
		"oldest":     {"4", "", ""},
	} {
		sel := `figure[data-chart="` + key + `"]`
		ectx, cancel := step(bctx)
		points, err := chromedp.Run(ectx, chromedp.Evaluate[string](`document.querySelector('`+sel+`').dataset.points`))
		width, err2 := chromedp.Run(ectx, chromedp.Evaluate[float64](`document.querySelector('`+sel+` polyline').getBBox().width`))
		cancel()
		if err != nil || err2 != nil {
			t.Fatalf("%s: %v %v", key, err, err2)
		}
		if points != want.points || width <= 0 {
			t.Errorf("%s chart: %s points, drawn %.1f wide; want %s points and a width", key, points, width, want.points)
		}
		if want.max == "" {
			continue
		}
		if got := text(t, bctx, sel+" [data-chart-max]"); got != want.max {
			t.Errorf("%s chart's highest: %q, want %q", key, got, want.max)
		}
		if got := text(t, bctx, sel+" [data-chart-last]"); got != want.last {
			t.Errorf("%s chart's latest: %q, want %q", key, got, want.last)
		}
	}
}
