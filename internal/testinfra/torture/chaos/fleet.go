package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/outboxcli"
)

// A run of several outboxes (Config.Outboxes) serves them all from the same relay
// processes, each one `outbox relay --config` with the run's outboxes list: a relay
// fleet, as operations.md ("Many outboxes from one relay") describes it. The outboxes
// lie in two databases of the server, each outbox publishes to a destination of its own
// (outboxRouter), and each has its own writers and history. The first writes half of
// the run's rate, the last is a quiet tenant whose relay parks between its writes (the
// relays park after fleetParkAfter without work), and the others share the rest. The check
// is each outbox's history against its own destination, plus every copy found in
// another outbox's destination (Report.Crossed).
//
// The fleet's relays run the outbox command, not a library relay wrapped by the run, so
// no event is poison: the broker side cannot refuse one.

// envFleet names the child relay's config file: set, the child runs `outbox relay`.
const envFleet = "OUTBOX_TORTURE_FLEET_CONFIG"

// fleetParkAfter is the relays' --park-after: a busy outbox's relays never park, an idle
// one's soon do. It is longer than a starting relay takes to get its first shards (its
// first lease rounds), or relays would park before they ever published.
const fleetParkAfter = 3 * time.Second

// quietRate is the last outbox's rate in a run of several, in transactions a second:
// its writes come further apart than fleetParkAfter, so that it parks and wakes all
// through the run.
const quietRate = 0.2

// runOutbox is one outbox of a run: where it is, its writers, what they did, and the
// copies read back from its destination.
type runOutbox struct {
	name     string // in the relays' outboxes list; "" in a run of one outbox
	db       *testdb.DB
	url      string // the writers' database URL
	relayURL string // the relays' (through the run's database proxy)
	hist     *torture.History
	wl       *torture.Workload
	log      *torture.DeliveryLog
}

// fleetOutboxes makes the n outboxes of a run of several: fresh schemas, every other one
// in a second database made on the server of databaseURL for the run.
func fleetOutboxes(tb testenv.TB, databaseURL string, n int) []*runOutbox {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	second := testdb.NewDatabase(tb, databaseURL, "torture_"+hex.EncodeToString(b[:]))
	outs := make([]*runOutbox, n)
	for i := range outs {
		u := databaseURL
		if i%2 == 1 {
			u = second
		}
		outs[i] = &runOutbox{name: "o" + strconv.Itoa(i+1), db: testdb.MigratedAt(tb, u), url: u}
	}
	return outs
}

// fleetRate is outbox i's share of rate among n: half for the first, quietRate for the
// last, an equal part of the rest for the others.
func fleetRate(rate float64, i, n int) float64 {
	switch {
	case i == 0:
		return rate / 2
	case i == n-1:
		return quietRate
	default:
		return rate / 2 / float64(n-2)
	}
}

// fleetPoolConns bounds each relay process's pool per database: three processes and
// two databases stay well below the server's 100 connections, with the writers', the
// probes' and the run's own.
const fleetPoolConns = 6

// fleetRelayURL returns databaseURL with application_name set, so that pg-terminate
// finds the relays' sessions, and the pool bounded to fleetPoolConns.
func fleetRelayURL(databaseURL, appName string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return databaseURL
	}
	q := u.Query()
	q.Set("application_name", appName)
	q.Set("pool_max_conns", strconv.Itoa(fleetPoolConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// writeFleetConfig writes the relays' config file into dir: the settings the library
// relays of a run of one outbox get (RelayMain), and the outboxes list.
func writeFleetConfig(tb testenv.TB, dir string, c relayConfig, outs []*runOutbox, router outboxRouter) string {
	tb.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "broker: %s\nlease-ttl: %s\nmax-in-flight: %d\npublish-batch-size: %d\nmax-attempts: %d\n",
		strconv.Quote(c.broker), c.ttl, c.inFlight, min(250, c.inFlight), c.maxAttempts)
	if c.batch > 0 {
		fmt.Fprintf(&b, "batch-size: %d\n", c.batch)
	}
	fmt.Fprintf(&b, "poll-interval: 100ms\nretry-min-delay: 50ms\nretry-max-delay: 200ms\npublish-timeout: 5s\n"+
		"cleanup-interval: 1s\nretention: %s\nrotate-rows: %d\nshutdown-grace: 5s\n"+
		"park-after: %s\nparked-poll-interval: 1s\nlog-format: json\noutboxes:\n", historyRetention, ringRotateRows, fleetParkAfter)
	for _, o := range outs {
		fmt.Fprintf(&b, "  - name: %s\n    database-url: %s\n    schema: %s\n    route: %s\n",
			o.name, strconv.Quote(fleetRelayURL(o.relayURL, c.appName)), strconv.Quote(o.db.Schema), strconv.Quote(router.OutboxRoute(o.name)))
	}
	path := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// startupWindow is how long a fleet relay process may run and still count as failing
// to start when it exits with an error: a process started while the broker is cut off
// cannot connect and exits, and is started again, as its service manager would. One
// that fails later is a relay that exited on its own: the run reports it.
const startupWindow = 30 * time.Second

// fleetRelayMain runs `outbox relay --config config` as the slot's relay (RelayMain),
// until SIGTERM, and returns the exit code. The command takes nothing from the
// environment: the file is the whole configuration.
func fleetRelayMain(config string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	noEnv := func(string) string { return "" }
	for {
		started := time.Now()
		code := outboxcli.Main(ctx, []string{"relay", "--config", config, "--relay-id", os.Getenv(envID)}, noEnv, os.Stdout, os.Stderr)
		if code == 0 || ctx.Err() != nil || time.Since(started) > startupWindow {
			return code
		}
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Warn("relay failed to start; starting it again", "exit_status", code)
		select {
		case <-ctx.Done():
			return code
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// splitDeliveries hands every copy of all to the log of the outbox whose destination
// holds it, and counts into rep the copies that are in another outbox's destination than
// the one that wrote them, or in none.
func splitDeliveries(all *torture.DeliveryLog, outs []*runOutbox, router outboxRouter, rep *torture.Report) {
	writer := map[outbox.ID]string{}
	byName := map[string]*runOutbox{}
	for _, o := range outs {
		byName[o.name] = o
		for _, t := range o.hist.Txns() {
			for _, e := range t.Events {
				writer[e.ID] = o.name
			}
		}
	}
	for _, d := range all.Copies() {
		name := router.OutboxOf(d.Dest)
		o, ok := byName[name]
		if w := writer[d.ID]; !ok || w != name {
			rep.Crossed++
			rep.Example("crossed: event %s (key %s) written into outbox %q read back from %s", d.ID, d.Key, w, d.Dest)
		}
		if ok {
			o.log.Add(d)
		}
	}
}
