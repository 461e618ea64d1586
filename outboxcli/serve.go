package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// This file serves the relay's HTTP endpoints for operators: /metrics, /healthz and
// /readyz on --metrics-addr. serveHTTP runs any handler on an address of its own, for
// other servers of the relay (the web console) too.
//
// Nothing served here prints a secret: the metrics carry the relay ID, topics and the
// broker kind; /readyz answers with fixed reasons and leaves the errors behind them to
// the log, which the CLI scrubs.

// checkListenAddr rejects an address net.Listen cannot take, before anything connects.
func checkListenAddr(flagName, addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if _, perr := strconv.ParseUint(port, 10, 16); perr != nil && port != "" {
			if _, lerr := net.LookupPort("tcp", port); lerr != nil {
				err = fmt.Errorf("unknown port %q", port)
			}
		}
	}
	if err != nil {
		return usageErrorf("--%s: %q is not a listen address (%v): want host:port or :port, like :9187 or 127.0.0.1:9187", flagName, addr, err)
	}
	return nil
}

// newServer returns the HTTP server of the metrics, health and console endpoints, with
// timeouts, so that a slow or idle client cannot hold a connection (and its goroutine)
// open: 10 s for the request's headers, 30 s for the whole request, 2 minutes to write
// the answer and between requests on a kept-alive connection.
func newServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serveHTTP listens on addr and serves h in the background until stop is called. It
// returns once the address is bound, so that a taken address fails the command before
// the relay starts. what names the server in the log ("metrics and health checks"); the
// log line gives the bound address (with the port chosen for :0). stop shuts the server
// down gracefully within its ctx and returns once it has stopped; calling it again does
// nothing.
func serveHTTP(ctx context.Context, what, addr string, h http.Handler, log *slog.Logger) (stop func(context.Context) error, err error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := newServer(h, log)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server failed", "server", what, "err", err)
		}
	}()
	log.Info("serving "+what, "addr", ln.Addr().String())
	var once sync.Once
	return func(ctx context.Context) error {
		var err error
		once.Do(func() {
			err = srv.Shutdown(ctx)
			if err != nil {
				_ = srv.Close()
			}
			<-done
		})
		return err
	}, nil
}

// newMetricsRegistry returns the registry behind /metrics: the Go runtime's and the
// process's collectors, to which the relay's and the outbox's metrics are added.
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// opsMux serves /metrics from reg, /healthz and /readyz. More handlers may be mounted on
// it. It registers the /metrics handler's own counters on reg: call it once per registry.
func opsMux(reg *prometheus.Registry, ready *readiness, log *slog.Logger) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, // a failing collector costs its series, not the scrape
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /readyz", ready)
	return mux
}

// readyTimeout bounds the database and broker checks of one /readyz request. Probes
// should allow a little more (Kubernetes: timeoutSeconds: 3).
const readyTimeout = 2 * time.Second

// readiness answers /readyz. The relay is ready when
//
//   - it is running: not ready while it connects at start ("starting") nor once it
//     stops ("stopping", from the signal on, while it drains);
//   - the database answers a ping;
//   - the broker answers a ping, when the publisher can be pinged (outbox.Pinger: every
//     broker of the CLI); with several destinations, each destination does;
//   - its last lease round succeeded less than --lease-ttl ago. A round takes every free
//     or expired shard up to the relay's fair share, so after one the relay holds its
//     share of what is free: some shards, or none when the other relays hold them all (a
//     standby, when there are more relays than shards to go round; ready too, so that a
//     rollout of more replicas than shards completes). A relay whose destinations and
//     routing differ from those of the relays holding shards takes none until they stop
//     (outboxdriver.LeaseState.GiveWay): a standby too, so that a rolling change of the
//     routing completes, with the reason in its answer.
//
// The answer is 200 or 503 with one line of plain text; the errors behind a 503 go to
// the log when readiness changes, never to the response. It is safe for concurrent use.
type readiness struct {
	log *slog.Logger

	mu     sync.Mutex
	phase  string // "starting", "running", "stopping"
	checks []readyCheck
	leases leaseStatus
	last   string // the key of the last answer, to log changes only
}

// leaseStatus says whether the relay's lease rounds make it ready (leaseWatch; a fleet's
// outboxes together): ok, a key that changes when the reason does, and a line for /readyz.
type leaseStatus interface {
	status() (ok bool, key, text string)
}

// readyCheck is a dependency /readyz pings.
type readyCheck struct {
	name  string // "database", "broker"
	check func(context.Context) error
}

func newReadiness(log *slog.Logger) *readiness {
	return &readiness{log: log, phase: "starting", last: "starting"}
}

// running starts answering from the checks and the relay's lease rounds.
func (r *readiness) running(leases leaseStatus, checks ...readyCheck) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phase, r.leases, r.checks = "running", leases, checks
}

// stopping makes /readyz answer 503 from now on.
func (r *readiness) stopping() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phase = "stopping"
}

func (r *readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ok, text := r.check(req.Context())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", text)
		return
	}
	_, _ = fmt.Fprintf(w, "ready: %s\n", text)
}

// check returns whether the relay is ready and the line that says why.
func (r *readiness) check(ctx context.Context) (bool, string) {
	r.mu.Lock()
	phase, checks, leases := r.phase, r.checks, r.leases
	r.mu.Unlock()
	switch phase {
	case "starting":
		return false, "starting: connecting to the database and the broker"
	case "stopping":
		return false, "stopping"
	}

	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.check(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			name := checks[i].name
			r.changed("unreachable:"+name, func() {
				r.log.Warn("not ready: "+name+" unreachable", "err", err)
			})
			return false, name + " unreachable"
		}
	}
	ok, key, text := leases.status()
	r.changed(key, func() {
		if ok {
			r.log.Info("ready", "leases", text)
		} else {
			r.log.Warn("not ready", "leases", text)
		}
	})
	return ok, text
}

// changed calls log when key differs from the last answer's.
func (r *readiness) changed(key string, log func()) {
	r.mu.Lock()
	changed := r.last != key
	r.last = key
	r.mu.Unlock()
	if changed {
		log()
	}
}

// leaseWatch is the relay's store with the outcome of the last lease round kept for
// /readyz. Give the relay store(), which keeps the store's optional methods visible.
type leaseWatch struct {
	outboxdriver.Store
	ttl time.Duration    // the relay's LeaseTTL
	now func() time.Time // time.Now; a test replaces it

	mu       sync.Mutex
	synced   time.Time // when the last successful round returned; zero before the first
	state    outboxdriver.LeaseState
	released bool // the last round gave every lease back: the relay is leaving
}

func newLeaseWatch(s outboxdriver.Store, ttl time.Duration) *leaseWatch {
	return &leaseWatch{Store: s, ttl: ttl, now: time.Now}
}

// store returns w as the relay's store, with the optional interfaces of the store it
// wraps (LISTEN, maintenance, the pending ring and priorities: PostgreSQL's driver has
// them all, the other stores none).
func (w *leaseWatch) store() outboxdriver.Store {
	type polling interface {
		outboxdriver.Listener
		outboxdriver.Maintainer
		outboxdriver.Recycler
		outboxdriver.PriorityFetcher
	}
	type full interface { // PostgreSQL through pgx: WAL mode too
		polling
		outboxdriver.Streamer
		outboxdriver.SnapshotFetcher
	}
	if f, ok := w.Store.(full); ok {
		return struct {
			*leaseWatch
			full
		}{w, f}
	}
	if f, ok := w.Store.(polling); ok {
		return struct {
			*leaseWatch
			polling
		}{w, f}
	}
	return w
}

// SyncLeases implements outboxdriver.Store.
func (w *leaseWatch) SyncLeases(ctx context.Context, req outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	st, err := w.Store.SyncLeases(ctx, req)
	if err == nil {
		w.mu.Lock()
		w.synced, w.state, w.released = w.now(), st, req.TTL <= 0
		w.mu.Unlock()
	}
	return st, err
}

// shared reports whether, at the last lease round, another relay of the outbox was live.
func (w *leaseWatch) shared() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.synced.IsZero() && w.state.Live > 1
}

// status says whether the lease rounds make the relay ready: ok, a key that changes
// when the reason does (for logging changes), and a line for /readyz.
func (w *leaseWatch) status() (ok bool, key, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.synced.IsZero():
		return false, "no-round", "no lease round completed yet"
	case w.released:
		return false, "released", "leases given back: stopping"
	case w.now().Sub(w.synced) > w.ttl:
		return false, "stale", fmt.Sprintf("no successful lease round for %s (longer than the lease TTL, %s)",
			w.now().Sub(w.synced).Round(time.Second), w.ttl)
	}
	st := w.state
	if ids, fps := st.GiveWayTo(); len(ids) > 0 {
		return true, "give-way:" + strings.Join(ids, ","), fmt.Sprintf("standby: relays %s hold the shards under other destinations and routing (fingerprint %s); this relay takes them once those stop",
			strings.Join(ids, ", "), strings.Join(fps, ", "))
	}
	if len(st.Held) == 0 {
		return true, "standby", fmt.Sprintf("standby: every shard is leased by the other relays (%d live relays, %d shards)", st.Live, st.Shards)
	}
	return true, "holds", fmt.Sprintf("holds %d of %d shards (fair share %d, %d live relays)", len(st.Held), st.Shards, st.Target, st.Live)
}
