package outboxcli

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/internal/console"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxprom"
)

// A fleet is one relay process serving many outboxes: the config file's outboxes list
// names them, each entry one outbox (schema: ...) or a rule that finds them (schemas: a
// pattern over the schemas of a PostgreSQL database that hold an outbox). Each outbox
// gets a relay of its own, with its own shard leases, so any number of processes share
// a fleet the way relays share one outbox; the outboxes of one database URL share one
// connection pool, and the ones with one route share one broker connection. An outbox
// that cannot be served (its database down, its schema not migrated) is tried again
// with backoff while the others are served. Rules are applied again every
// --discover-interval and on SIGHUP: a new outbox is served from then on, and one that
// is gone stops (it drains, and gives its leases back).
//
// A PostgreSQL outbox's relay runs only while the outbox has work: it starts parked, and
// is parked again once its relay published nothing, and held no message, for --park-after; a parked outbox is
// watched, with every other parked outbox of its database, from one connection
// (outboxpgx.IdleWatch), which wakes it at the next write. The running relays listen
// on that connection too: per database, a fleet takes the pool and that one listening
// connection.

// fleetKeys are the keys an entry of the outboxes list may hold: where the outbox is,
// and the relay settings that may differ per outbox. Every other setting is the
// process's.
var fleetKeys = map[string]bool{
	"name": true, "schemas": true, "databases": true,
	"database-url": true, "schema": true, "prefix": true, "rotate-rows": true, "route": true,
	"batch-size": true, "max-in-flight": true, "publish-batch-size": true, "poll-interval": true,
	"lease-ttl": true, "max-attempts": true, "retry-min-delay": true, "retry-max-delay": true,
	"publish-timeout": true, "retention": true, "cleanup-interval": true, "cleanup-batch": true,
}

const (
	discoverIntervalDefault = time.Minute
	parkAfterDefault        = time.Minute
	parkedPollDefault       = 5 * time.Second
	// metricsMaxDefault bounds the outboxes with series of their own: about 40 series
	// an outbox (more per topic and error kind), so 200 outboxes are some 10,000 series.
	metricsMaxDefault = 200
	// fleetPoolConns is a fleet's pool size per database URL when the URL does not set
	// pool_max_conns: the outboxes of the database share it.
	fleetPoolConns = 16
	// fleetConnIdle is how long a fleet's pooled connection may sit idle before it is
	// closed, unless the URL sets pool_max_conn_idle_time (pgxpool's default is 30
	// minutes): a database whose outboxes are all parked keeps its listening connection
	// and the one its parked-poll statement uses, not the pool its relays filled.
	// fleetHealthCheck is how often the pool looks for such connections.
	fleetConnIdle    = 30 * time.Second
	fleetHealthCheck = 10 * time.Second
	// fleetRetryMax bounds the wait before an outbox that could not be served is tried
	// again; fleetReconnectMax, when its database could not be reached or did not
	// answer in time: the outbox is served again within it once the database is back.
	fleetRetryMax     = time.Minute
	fleetReconnectMax = 5 * time.Second
)

// fleetEntry is one entry of the outboxes list, with its settings resolved: the entry's
// keys over the command line, the environment and the file's top level.
type fleetEntry struct {
	name string // given; "" for the default
	line int
	o    *relayFlags
	rule rule // schemas: or databases: the entry is a rule
}

// fleetOutbox is one outbox to serve.
type fleetOutbox struct {
	name string
	key  string // where its tables are: two entries with one key name the same outbox
	o    *relayFlags
	rule int // the rule that found it; -1 when declared
}

// fleetEntries reads the config file's outboxes list. Everything is checked here,
// before anything connects.
func fleetEntries(inv *invocation) ([]fleetEntry, error) {
	cf := inv.config
	var entries []fleetEntry
	names := map[string]int{}
	for _, item := range cf.outboxes {
		where := cf.at(item.line)
		o, err := fleetFlags(inv, item)
		if err != nil {
			return nil, err
		}
		e := fleetEntry{line: item.line, o: o}
		if v, ok := item.values["name"]; ok {
			e.name = v.values[0]
			if first, dup := names[e.name]; dup {
				return nil, usageErrorf("%s: name %q is taken by the outbox at line %d", cf.at(v.line), e.name, first)
			}
			names[e.name] = item.line
		}
		e.rule = ruleOf(item)
		kind, err := o.db.kind()
		if err != nil {
			return nil, usageErrorf("%s: %v", where, err)
		}
		if e.rule.isRule() && kind != dbPostgres {
			return nil, usageErrorf("%s: %s: %s has no schemas or databases to look through; list its outboxes one by one", where, e.rule, kind)
		}
		if err := o.checkTuning(); err != nil {
			return nil, usageErrorf("%s: %v", where, err)
		}
		if _, err := o.db.target("outbox relay"); err != nil {
			return nil, usageErrorf("%s: %v", where, err)
		}
		cfg := o.cfg
		cfg.Logger = slog.New(slog.DiscardHandler)
		if err := cfg.Validate(); err != nil {
			return nil, usageErrorf("%s: %v", where, relayConfigError(err))
		}
		inv.secrets.addDSN(o.db.url)
		entries = append(entries, e)
	}
	// A declared outbox named twice, by its tables or by its name, is a mistake.
	keys := map[string]int{}
	for _, e := range entries {
		if e.rule.isRule() {
			continue
		}
		key, name := outboxKey(e.o.db)
		if first, dup := keys[key]; dup {
			return nil, usageErrorf("%s: the outbox at line %d already names these tables (%s)", cf.at(e.line), first, key)
		}
		keys[key] = e.line
		if e.name == "" {
			if first, dup := names[name]; dup {
				return nil, usageErrorf("%s: its name would be %q, taken by the outbox at line %d: give one a name", cf.at(e.line), name, first)
			}
			names[name] = e.line
		}
	}
	return entries, nil
}

// fleetFlags resolves the settings of one entry of the outboxes list.
func fleetFlags(inv *invocation, item outboxItem) (*relayFlags, error) {
	fs := newFlagSet(inv.path)
	o := newRelayFlags(fs)
	fs.String("config", "", "")
	if _, err := parseArgs(fs, inv.args); err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	for _, k := range sortedKeys(item.values) {
		if k == "name" || k == "schemas" || k == "databases" {
			continue
		}
		e := item.values[k]
		if err := fs.Set(k, e.values[0]); err != nil {
			return nil, usageErrorf("%s: --%s: %s", inv.config.at(e.lines[0]), k, valueProblem(fs.Lookup(k), e.values[0], err))
		}
	}
	if err := applySources(fs, inv.env, inv.config); err != nil {
		return nil, err
	}
	return o, nil
}

func validFleetName(s string) bool {
	if s == "" || len(s) > 100 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// outboxKey names where an outbox's tables are, and its default name.
func outboxKey(o *dbFlags) (key, name string) {
	kind, _ := o.kind()
	t, _ := o.target("outbox relay")
	var where, db string
	switch kind {
	case dbPostgres:
		c := t.pg.ConnConfig
		where, db = fmt.Sprintf("postgres %s:%d/%s %s", c.Host, c.Port, c.Database, o.schema), c.Database+"."+o.schema
	case dbMySQL:
		where, db = fmt.Sprintf("mysql %s/%s", t.mysql.Addr, t.mysql.DBName), t.mysql.DBName
	case dbSQLite:
		where, db = "sqlite "+t.path, strings.TrimSuffix(path.Base(t.path), path.Ext(t.path))
	}
	if p := strings.TrimSuffix(o.prefix, "_"); p != "" {
		db += "." + p
	}
	return where + " prefix " + o.prefix, db
}

// runFleet runs the relay for every outbox of the config file's outboxes list.
func (o *relayFlags) runFleet(ctx context.Context, inv *invocation) error {
	log, err := newLogger(inv.stderr, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{"discover-interval": o.discoverEvery, "parked-poll-interval": o.parkedPoll} {
		if d <= 0 {
			return usageErrorf("--%s: must be a positive duration, not %s", name, d)
		}
	}
	if o.metricsMax < 0 {
		return usageErrorf("--metrics-max-outboxes: must be 0 or more, not %d", o.metricsMax)
	}
	if o.parkAfter <= 0 && o.parkAfter != -1 {
		return usageErrorf("--park-after: must be a positive duration, or -1 never to park")
	}
	if err := checkListenAddr("metrics-addr", o.metricsAddr); err != nil {
		return err
	}
	if err := o.console.check(ctx, inv); err != nil {
		return err
	}
	if o.source != "poll" {
		return usageErrorf("--source: the relays of an outboxes list poll (WAL mode needs a slot per outbox, set up one by one)")
	}
	if cf := inv.config; cf.destinations != nil || cf.routing != nil || o.defaultDest != defaultDestination {
		return usageErrorf("%s: destinations and routing serve a relay of one outbox; the outboxes of a list publish to --broker, each by its route", cf.path)
	}
	entries, err := fleetEntries(inv)
	if err != nil {
		return err
	}
	f := &fleet{top: o, log: log, entries: entries, members: map[string]*fleetMember{},
		dbs: map[string]*fleetDB{}, routes: map[string]*fleetRoute{}, relayID: fleetRelayID(), ctx: ctx}
	// Every route is checked before anything connects.
	dests := map[string]*brokers.Dest{}
	for _, e := range entries {
		route := e.o.broker.route
		if _, ok := dests[route]; ok {
			continue
		}
		b := *o.broker
		b.route = route
		if dests[route], err = b.check(log, inv.secrets); err != nil {
			return cfErrorAt(inv.config, e.line, err)
		}
	}

	var first *brokers.Dest // for the tracer's broker attributes
	for _, e := range entries {
		first = dests[e.o.broker.route]
		break
	}
	obs, reg, ready, stopServices, err := o.startServices(ctx, inv, first.Broker(), log)
	if err != nil {
		return err
	}
	defer stopServices()
	if obs != nil {
		f.observers = append(f.observers, obs)
	}
	f.reg = reg
	if reg != nil {
		reg.MustRegister(fleetCollector{f})
	}
	for _, route := range sortedKeys(dests) {
		d := dests[route]
		log.Info("connecting to the broker", "broker", d.Broker().Name, "url", brokers.Redact(o.broker.url), "route", route)
		b := *o.broker
		b.route = route
		opened, err := b.open(ctx, d)
		if err != nil {
			f.closeBrokers()
			return err
		}
		f.routes[route], f.brokerLabel = newFleetRoute(ctx, opened), d.Broker().Label
	}
	defer f.closeBrokers()
	defer f.closeDBs()
	if ready != nil {
		var checks []readyCheck
		for _, route := range sortedKeys(f.routes) {
			if p, ok := f.routes[route].shared.Publisher.(outbox.Pinger); ok {
				checks = append(checks, readyCheck{name: "broker", check: p.Ping})
			}
		}
		ready.running(f, checks...)
		defer ready.stopping()
	}

	stopConsole, err := o.console.start(ctx, inv, console.Config{Outboxes: f.consoleOutboxes}, log)
	if err != nil {
		return err
	}
	defer stopConsole()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(o.discoverEvery)
	defer tick.Stop()
	for {
		f.reconcile(ctx)
		select {
		case <-ctx.Done():
			if ready != nil {
				ready.stopping()
			}
			f.wg.Wait()
			log.Info("relay exited cleanly", "outboxes", len(f.members))
			return nil
		case <-tick.C:
		case <-hup:
			log.Info("SIGHUP: looking for outboxes")
		}
	}
}

// retryCap is the longest wait before an outbox that could not be served for err is
// tried again: a few seconds when the database was out of reach (it may be back any
// moment), a minute otherwise (an outbox not migrated waits for an operator).
func retryCap(err error) time.Duration {
	var ce *pgconn.ConnectError
	var ne net.Error
	if errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) {
		return fleetReconnectMax
	}
	return fleetRetryMax
}

// cfErrorAt prefixes a usage error with the config file's line.
func cfErrorAt(cf *configFile, line int, err error) error {
	var ue *usageError
	if errors.As(err, &ue) {
		return usageErrorf("%s: %s", cf.at(line), ue.msg)
	}
	return err
}

// fleet runs the relays of a fleet's outboxes.
type fleet struct {
	top         *relayFlags
	log         *slog.Logger
	entries     []fleetEntry
	reg         *prometheus.Registry // nil without --metrics-addr
	observers   []outbox.Observer
	routes      map[string]*fleetRoute // by route
	brokerLabel string
	relayID     string          // every outbox's relay's, unless the file sets relay-id
	ctx         context.Context // the fleet's: the idle watches run until it ends

	mu              sync.Mutex
	members         map[string]*fleetMember // by key
	unmeteredLogged bool                    // the --metrics-max-outboxes warning was logged
	dbs             map[string]*fleetDB     // by database URL
	wg              sync.WaitGroup
}

// fleetMember is an outbox being served.
type fleetMember struct {
	fleetOutbox
	cancel  context.CancelFunc
	metrics *outboxprom.Metrics // nil without --metrics-addr, or past --metrics-max-outboxes
	reg     *memberRegisterer   // where metrics is registered; nil when it is nil

	mu     sync.Mutex
	leases *leaseWatch // of the relay running now; nil between runs
	state  string      // why it is not served, between runs: stateParked, stateStandby, or an error
	drv    storeDriver // made on first use (fleet.driver)
}

func (m *fleetMember) driver() storeDriver {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.drv
}

// driver returns m's driver on db's connection, made on first use: one for the
// outbox's life, so that what it remembers (the listening sessions it closed, which
// the parked outboxes' watch adds to) holds from one run of the relay to the next.
func (f *fleet) driver(m *fleetMember, db *fleetDB) (storeDriver, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.drv == nil {
		d, err := m.o.db.newDriver(db.kind, db.pool, db.db)
		if err != nil {
			return nil, err
		}
		m.drv = d
	}
	return m.drv, nil
}

// fleetDB is one database's connection, shared by its outboxes.
type fleetDB struct {
	mu   sync.Mutex // held while connecting
	kind dbKind
	pool *pgxpool.Pool
	db   *sql.DB
	// idle is PostgreSQL's one listening session: the parked outboxes are watched
	// there, and the running relays listen there.
	idle *outboxpgx.IdleWatch
}

// watchedListen is an outbox's driver whose Listen is on its database's listening
// session (outboxpgx.IdleWatch.Listen). It keeps the driver's other methods.
type watchedListen struct {
	*outboxpgx.Driver
	watch *outboxpgx.IdleWatch
}

func (d watchedListen) Listen(ctx context.Context, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
	return d.watch.Listen(ctx, d.Driver, wake, gate)
}

// fleetRelayID is the relay ID of every outbox a process serves: leases are per
// outbox, and one ID keeps an outbox's metric series the same across its relay's
// parking and waking.
func fleetRelayID() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "relay"), os.Getpid(), hex.EncodeToString(b[:]))
}

// The states of an outbox whose relay does not run in this process, but which is served:
// parked (idle: the watch wakes it) or standing by (another process's relay serves it).
const (
	stateParked  = "parked"
	stateStandby = "standby"
)

// errParked ends a relay's run that the fleet stopped because its outbox was idle;
// errStandby one it stopped because another process's relay serves the outbox and this
// one had little to do.
var (
	errParked  = errors.New("parked")
	errStandby = errors.New("standby")
)

// parkable passes every event on but the stop of a relay the fleet parks: the relay
// of a parked outbox counts as up (outbox_relay_up 1), as it wakes when a message comes.
type parkable struct {
	outbox.Observer
	parking *atomic.Bool
}

func (p parkable) Running(e outbox.RunningEvent) {
	if !e.Running && p.parking.Load() {
		return
	}
	p.Observer.Running(e)
}

// reconcile starts serving the outboxes the entries name and stops the ones they no
// longer do. An outbox that a rule found stays while that rule cannot be applied (its
// database is down).
func (f *fleet) reconcile(ctx context.Context) {
	want := map[string]fleetOutbox{}
	failed := map[int]bool{}         // rules that could not be applied
	unreachable := map[string]bool{} // databases a rule could not search, by URL
	for i, e := range f.entries {
		if !e.rule.isRule() {
			key, name := outboxKey(e.o.db)
			if _, dup := want[key]; dup {
				continue // reported at start
			}
			want[key] = fleetOutbox{name: cmp.Or(e.name, name), key: key, o: e.o, rule: -1}
			continue
		}
		found, err := e.rule.find(ctx, e.o.db, f.searchConn(ctx))
		if err != nil {
			if ctx.Err() == nil {
				f.log.Error("could not look for outboxes; those found before are served meanwhile", "line", e.line, "rule", e.rule.String(), "err", err)
			}
			failed[i] = true
			continue
		}
		for _, fd := range found {
			if fd.err != nil {
				if ctx.Err() == nil {
					f.log.Error("could not look for outboxes in a database; those found there before are served meanwhile",
						"line", e.line, "rule", e.rule.String(), "database", redactDSN(fd.db.url), "err", fd.err)
				}
				unreachable[fd.db.url] = true
				continue
			}
			for _, d := range fd.in {
				if _, err := d.driver(); err != nil {
					f.log.Warn("schema not served: its name is not a valid outbox schema", "schema", d.schema, "err", err)
					continue
				}
				o := *e.o
				o.db = d
				key, name := outboxKey(d)
				if _, taken := want[key]; !taken {
					want[key] = fleetOutbox{name: name, key: key, o: &o, rule: i}
				}
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, m := range f.members {
		if _, ok := want[key]; ok || m.rule >= 0 && (failed[m.rule] || unreachable[m.o.db.url]) {
			continue
		}
		f.log.Info("outbox gone: stopping its relay", "outbox", m.name)
		m.cancel()
		if m.reg != nil {
			m.reg.unregisterAll() // its series go with it, and its place under --metrics-max-outboxes
		}
		delete(f.members, key)
	}
	names := map[string]bool{}
	for _, m := range f.members {
		names[m.name] = true
	}
	for _, key := range sortedKeys(want) {
		if _, ok := f.members[key]; ok || ctx.Err() != nil {
			continue
		}
		ob := want[key]
		if names[ob.name] {
			f.log.Error("two outboxes would have one name: the second is not served; give one a name in the config file", "outbox", ob.name, "where", key)
			continue
		}
		names[ob.name] = true
		mctx, cancel := context.WithCancel(ctx)
		m := &fleetMember{fleetOutbox: ob, cancel: cancel, state: "connecting"}
		if f.reg != nil {
			if metered := f.metered(); metered < f.top.metricsMax {
				m.reg = &memberRegisterer{Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"outbox": ob.name}, f.reg)}
				m.metrics = outboxprom.New(outboxprom.Config{Registerer: m.reg, Broker: f.brokerLabel})
			} else if !f.unmeteredLogged {
				f.unmeteredLogged = true
				f.log.Warn("outboxes beyond --metrics-max-outboxes are served without series of their own; outbox_fleet_outboxes counts them",
					"metrics_max_outboxes", f.top.metricsMax, "outbox", ob.name)
			}
		}
		f.members[key] = m
		f.log.Info("serving outbox", "outbox", ob.name, "where", redactDSN(ob.o.db.url), "schema", ob.o.db.schema, "prefix", ob.o.db.prefix)
		f.wg.Go(func() { f.serve(mctx, m) })
	}
}

// metered counts the outboxes served with series of their own; f.mu is held.
func (f *fleet) metered() int {
	n := 0
	for _, m := range f.members {
		if m.reg != nil {
			n++
		}
	}
	return n
}

// memberRegisterer registers an outbox's collectors in the fleet's registry, under its
// outbox label, and remembers them, so that they go when the outbox does.
type memberRegisterer struct {
	prometheus.Registerer
	mu sync.Mutex
	cs []prometheus.Collector
}

func (r *memberRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.cs = append(r.cs, c)
	r.mu.Unlock()
	return nil
}

func (r *memberRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *memberRegisterer) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	r.cs = slices.DeleteFunc(r.cs, func(x prometheus.Collector) bool { return x == c })
	r.mu.Unlock()
	return r.Registerer.Unregister(c)
}

func (r *memberRegisterer) unregisterAll() {
	r.mu.Lock()
	cs := r.cs
	r.cs = nil
	r.mu.Unlock()
	for _, c := range cs {
		r.Registerer.Unregister(c)
	}
}

// fleetCollector exports how many outboxes the process serves, by state, and how many
// of them have no series of their own (--metrics-max-outboxes): a fixed number of
// series however many outboxes there are.
type fleetCollector struct{ f *fleet }

var (
	fleetOutboxesDesc = prometheus.NewDesc("outbox_fleet_outboxes",
		"Outboxes this process serves from its outboxes list, by state: running (its relay runs), parked (idle, watched), standby (another process's relay serves it), not_served (connecting, or failing and tried again).",
		[]string{"state"}, nil)
	fleetUnmeteredDesc = prometheus.NewDesc("outbox_fleet_outboxes_without_metrics",
		"Outboxes this process serves without series of their own, past --metrics-max-outboxes.", nil, nil)
)

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fleetOutboxesDesc
	ch <- fleetUnmeteredDesc
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	c.f.mu.Lock()
	members := make([]*fleetMember, 0, len(c.f.members))
	for _, m := range c.f.members {
		members = append(members, m)
	}
	c.f.mu.Unlock()
	counts := map[string]int{"running": 0, stateParked: 0, stateStandby: 0, "not_served": 0}
	unmetered := 0
	for _, m := range members {
		m.mu.Lock()
		switch {
		case m.state == stateParked || m.state == stateStandby:
			counts[m.state]++
		case m.leases != nil:
			counts["running"]++
		default:
			counts["not_served"]++
		}
		m.mu.Unlock()
		if m.reg == nil {
			unmetered++
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(fleetOutboxesDesc, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(fleetUnmeteredDesc, prometheus.GaugeValue, float64(unmetered))
}

// searchConn returns how a rule reaches a database to look for outboxes there: on the
// fleet's pool when it has one for the database, else on a connection of its own,
// closed after, so that a database without an outbox costs the fleet no pool and no
// listening session.
func (f *fleet) searchConn(ctx context.Context) func(*dbFlags) (querier, func(), error) {
	return func(d *dbFlags) (querier, func(), error) {
		f.mu.Lock()
		db := f.dbs[d.url]
		f.mu.Unlock()
		if db != nil {
			db.mu.Lock()
			pool := db.pool
			db.mu.Unlock()
			if pool != nil {
				return pool, func() {}, nil
			}
		}
		return connectOnce(ctx, d)
	}
}

// db returns the connection of o's database, shared by the outboxes of its URL,
// connecting on first use (and again after a failed connect).
func (f *fleet) db(ctx context.Context, o *relayFlags) (*fleetDB, error) {
	f.mu.Lock()
	d, ok := f.dbs[o.db.url]
	if !ok {
		d = &fleetDB{}
		f.dbs[o.db.url] = d
	}
	f.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil || d.db != nil {
		return d, nil
	}
	t, err := o.db.target("outbox relay")
	if err != nil {
		return nil, err
	}
	if t.kind == dbPostgres {
		if !strings.Contains(o.db.url, "pool_max_conns") {
			t.pg.MaxConns = max(t.pg.MaxConns, fleetPoolConns)
		}
		if !strings.Contains(o.db.url, "pool_max_conn_idle_time") {
			t.pg.MaxConnIdleTime = fleetConnIdle
		}
		if !strings.Contains(o.db.url, "pool_health_check_period") {
			t.pg.HealthCheckPeriod = fleetHealthCheck
		}
	}
	s, err := o.db.connect(ctx, t)
	if err != nil {
		return nil, err
	}
	d.kind, d.pool, d.db = t.kind, s.pool, s.db
	if t.kind == dbPostgres {
		d.idle = outboxpgx.NewIdleWatch(s.pool, f.top.parkedPoll)
		where := redactDSN(o.db.url)
		f.wg.Go(func() {
			d.idle.Run(f.ctx, func(err error) {
				f.log.Error("watch of the parked outboxes failed; trying again", "database", where, "err", err)
			})
		})
	}
	return d, nil
}

func (f *fleet) closeDBs() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.dbs {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.pool != nil {
			d.pool.Close()
		}
		if d.db != nil {
			_ = d.db.Close()
		}
	}
}

func (f *fleet) closeBrokers() {
	for _, r := range f.routes {
		r.close()
	}
}

// serve runs m's relay until ctx ends, starting it again after a failure.
func (f *fleet) serve(ctx context.Context, m *fleetMember) {
	log := f.log.With("outbox", m.name)
	// A PostgreSQL outbox starts parked when outboxes park: its relay runs once it has
	// something to publish, so that a fleet of idle outboxes starts without a relay, and
	// a LISTEN connection, each.
	park, standby, ran := f.top.parkAfter > 0, false, false
	for failures := 0; ; failures++ {
		started := time.Now()
		var err error
		if standby {
			var run bool
			if run, err = f.standby(ctx, m, log); err == nil && ctx.Err() != nil {
				return
			}
			standby, park = false, err == nil && !run
		}
		if park && err == nil {
			var woken bool
			if woken, err = f.parked(ctx, m, log, ran); err == nil && !woken {
				return // ctx ended
			}
			if err == nil {
				// Woken: unless another process's relay serves the outbox already.
				if standby, err = f.leaveToOthers(ctx, m); err == nil && standby {
					log.Info("outbox woken, but another process's relay serves it: standing by")
					failures = -1
					continue
				}
			}
		}
		if err == nil {
			err = f.runOne(ctx, m, log)
			ran = true
		}
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, errParked) && !errors.Is(err, errStandby) {
				log.Error("outbox relay stopped", "err", err)
			}
			return
		}
		if errors.Is(err, errParked) {
			park, failures = true, -1
			continue
		}
		if errors.Is(err, errStandby) {
			log.Info("another process's relay serves the outbox too, and this one had little to do: relay stopped, standing by")
			standby, failures = true, -1
			continue
		}
		park = park && f.top.parkAfter > 0 && !ran // a failure while parked: park again
		if time.Since(started) > fleetRetryMax {
			failures = 0
		}
		wait := min(time.Second<<min(failures, 6), retryCap(err))
		m.setState(fmt.Sprintf("not served: %v", err))
		log.Error("outbox not served; trying again", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// runOne connects m's outbox and runs its relay until ctx ends or it fails.
func (f *fleet) runOne(ctx context.Context, m *fleetMember, log *slog.Logger) error {
	o := m.o
	db, err := f.db(ctx, o)
	if err != nil {
		return err
	}
	drv, err := f.driver(m, db)
	if err != nil {
		return err
	}
	if err := o.db.checkRelayable(ctx, drv, log); err != nil {
		return err
	}
	cfg := o.cfg
	cfg.Logger = log
	cfg.Fingerprint = o.fingerprint(f.brokerLabel, nil)
	observers := append([]outbox.Observer(nil), f.observers...)
	var store outboxdriver.Store = drv
	if pg, ok := drv.(*outboxpgx.Driver); ok && db.idle != nil {
		store = watchedListen{pg, db.idle}
	}
	leases := newLeaseWatch(store, cfg.LeaseTTL)
	if m.metrics != nil {
		observers = append(observers, m.metrics)
		status := outboxprom.NewStatusCollector(drv, outboxprom.StatusConfig{Logger: log})
		if err := m.reg.Register(status); err == nil {
			defer m.reg.Unregister(status)
		}
	}
	var parking atomic.Bool
	cfg.Observer = parkable{outbox.MultiObserver(observers...), &parking}
	cfg.ID = f.memberRelayID(m)
	route := f.routes[o.broker.route]
	if broken.Has(broken.FleetOneRoute) { // canary: every outbox publishes with one route
		route = f.routes[sortedKeys(f.routes)[0]]
	}
	pub, released := route.publisher()
	defer released()
	relay, err := outbox.NewRelay(leases.store(), pub, cfg)
	if err != nil {
		return relayConfigError(err)
	}
	m.setLeases(leases)
	defer m.setLeases(nil)
	if db.idle == nil || f.top.parkAfter <= 0 {
		return relay.Run(ctx, f.top.grace)
	}
	// Parked once it has published nothing, and held no message, for --park-after.
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx, f.top.grace) }()
	tick := time.NewTicker(max(f.top.parkAfter/6, time.Second))
	defer tick.Stop()
	last, since := relay.Stats(), time.Now()
	heldBefore := true // the first tick counts as busy
	for {
		select {
		case err := <-done:
			return err
		case now := <-tick.C:
			// Idle: nothing published, failed or refused since the last tick, and
			// nothing held (a relay paused by an outage holds what it fetched).
			st := relay.Stats()
			held := st.Held > 0
			// Another process's relay serves the outbox too, this one held nothing at two
			// ticks in a row, and it is not the outbox's preferred relay: leave the
			// outbox to the others, and stand by.
			if light := !held && !heldBefore; light && leases.shared() {
				if leave, err := f.leaveToOthers(ctx, m); err == nil && leave {
					parking.Store(true)
					stop()
					if err := <-done; err != nil {
						return err
					}
					return errStandby
				}
			}
			heldBefore = held
			st.Shards, st.Held = 0, 0
			if st != last || held {
				last, since = st, now
				continue
			}
			if now.Sub(since) < f.top.parkAfter {
				continue
			}
			parking.Store(true)
			stop()
			if err := <-done; err != nil {
				return err
			}
			return errParked
		}
	}
}

// parked waits, m's relay not running, until m's outbox has messages to publish: woken
// false when ctx ended first. An outbox that cannot park (MySQL, SQLite) is woken at
// once. ran: its relay ran before (and the wait is logged).
func (f *fleet) parked(ctx context.Context, m *fleetMember, log *slog.Logger, ran bool) (woken bool, err error) {
	db, err := f.db(ctx, m.o)
	if err != nil {
		return false, err
	}
	if db.idle == nil {
		return true, nil
	}
	first := m.driver() == nil
	drv, err := f.driver(m, db)
	if err != nil {
		return false, err
	}
	if first {
		if err := m.o.db.checkRelayable(ctx, drv, log); err != nil {
			return false, err
		}
	}
	if ran {
		log.Info("outbox idle: relay parked until a message comes", "park_after", f.top.parkAfter)
	}
	m.setState(stateParked)
	pg := drv.(*outboxpgx.Driver)
	select {
	case <-ctx.Done():
		db.idle.Remove(pg)
		return false, nil
	case <-db.idle.Add(pg):
		log.Info("outbox woken: relay starting")
		return true, nil
	}
}

// A process standing by for an outbox starts its relay beside the other process's when
// standbyHelpBacklog messages that could be sent have waited standbyHelpAfter:
// a backlog more relays drain faster. A few late messages are no reason: when the
// machine or the database is what is slow, more relays make it slower.
const (
	standbyHelpAfter   = time.Second
	standbyHelpBacklog = 1000
)

// leaveToOthers reports whether another process's relay serves m's outbox now and ranks
// above this process's for it (preferred): this process then stands by. A woken outbox
// asks it, and a running relay that has little to do beside another.
func (f *fleet) leaveToOthers(ctx context.Context, m *fleetMember) (bool, error) {
	pg, ok := m.driver().(*outboxpgx.Driver)
	if !ok {
		return false, nil
	}
	self := f.memberRelayID(m)
	others, _, err := pg.Served(ctx, self, standbyHelpAfter, standbyHelpBacklog)
	if err != nil {
		return false, err
	}
	return len(others) > 0 && !preferred(m.name, self, others), nil
}

// memberRelayID is the id of m's relay: the process's, unless its settings name one.
func (f *fleet) memberRelayID(m *fleetMember) string { return cmp.Or(m.o.cfg.ID, f.relayID) }

// preferred reports whether relay self ranks above every relay of others for the
// outbox named name, by rendezvous hashing: each (outbox, relay) pair has a score, and
// the highest wins. Every process computes the same ranking from the same live relays,
// a relay's share of the outboxes is fair, and a process that joins or leaves moves
// only the outboxes it wins or held.
func preferred(name, self string, others []string) bool {
	score := func(id string) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(name))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(id))
		return h.Sum64()
	}
	mine := score(self)
	for _, o := range others {
		if s := score(o); s > mine || s == mine && o > self {
			return false
		}
	}
	return true
}

// standby waits while another process's relay serves m's outbox, looking every
// --parked-poll-interval: run (true) when a backlog waits (standbyHelpBacklog) or this
// process has become the outbox's preferred one (a process that served it left, or
// this one joined), or park (false) when no relay is live any more (the watch then wakes
// the outbox as a parked one). It holds no connection and no gate meanwhile, so the
// outbox's writers notify only for the relay that serves it.
func (f *fleet) standby(ctx context.Context, m *fleetMember, log *slog.Logger) (run bool, err error) {
	m.setState(stateStandby)
	pg := m.driver().(*outboxpgx.Driver)
	self := f.memberRelayID(m)
	tick := time.NewTicker(f.top.parkedPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-tick.C:
		}
		others, waiting, err := pg.Served(ctx, self, standbyHelpAfter, standbyHelpBacklog)
		switch {
		case err != nil:
			return false, err
		case len(others) == 0:
			return false, nil
		case waiting:
			log.Info("outbox has a backlog: relay starting beside the other processes'", "backlog", standbyHelpBacklog, "waited", standbyHelpAfter)
			return true, nil
		case preferred(m.name, self, others):
			log.Info("this process is the outbox's preferred one: relay starting, the other processes' will stand by", "others", others)
			return true, nil
		}
	}
}

func (m *fleetMember) setState(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state = s
}

func (m *fleetMember) setLeases(l *leaseWatch) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leases = l
	if l == nil && m.state == "" {
		m.state = "stopped"
	}
	if l != nil {
		m.state = ""
	}
}

// consoleOutboxes lists the outboxes for the web console's overview.
func (f *fleet) consoleOutboxes() []console.Outbox {
	f.mu.Lock()
	members := make([]*fleetMember, 0, len(f.members))
	for _, m := range f.members {
		members = append(members, m)
	}
	f.mu.Unlock()
	out := make([]console.Outbox, 0, len(members))
	for _, m := range members {
		m.mu.Lock()
		o := console.Outbox{Name: m.name, RelayID: cmp.Or(m.o.cfg.ID, f.relayID), State: cmp.Or(m.state, "starting")}
		if m.drv != nil {
			o.Admin = m.drv
		}
		if m.leases != nil {
			o.State = ""
		}
		m.mu.Unlock()
		out = append(out, o)
	}
	return out
}

// status implements leaseStatus: the fleet is ready when every outbox it serves is.
func (f *fleet) status() (ok bool, key, text string) {
	f.mu.Lock()
	members := make([]*fleetMember, 0, len(f.members))
	for _, m := range f.members {
		members = append(members, m)
	}
	f.mu.Unlock()
	sort.Slice(members, func(i, j int) bool { return members[i].name < members[j].name })
	var notReady []string
	for _, m := range members {
		m.mu.Lock()
		leases, state := m.leases, m.state
		m.mu.Unlock()
		if state == stateParked || state == stateStandby {
			continue
		}
		if leases != nil {
			var ok bool
			ok, _, state = leases.status()
			if ok {
				continue
			}
		}
		notReady = append(notReady, m.name+": "+state)
	}
	if len(members) == 0 {
		return false, "none", "no outbox found yet"
	}
	if len(notReady) == 0 {
		return true, "all", fmt.Sprintf("%d outboxes, each relay holds its share of the shards", len(members))
	}
	text = fmt.Sprintf("%d of %d outboxes not ready: %s", len(notReady), len(members), notReady[0])
	if len(notReady) > 1 {
		text += fmt.Sprintf(" (and %d more)", len(notReady)-1)
	}
	return false, strings.Join(notReady, "\n"), text
}
