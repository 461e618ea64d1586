// Package e2e holds the end-to-end fault tests: relays run as real child processes
// (this test binary, re-executed), publish to a real NATS JetStream, and are killed,
// paused and cut off from the broker while a writer commits and rolls back events.
// After every run the broker is read back completely and checked against the database.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxnats"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Child relay configuration travels in the environment.
const (
	envChild   = "OUTBOX_E2E_RELAY"
	envSchema  = "OUTBOX_E2E_SCHEMA"
	envNATS    = "OUTBOX_E2E_NATS"
	envPrefix  = "OUTBOX_E2E_SUBJECT_PREFIX"
	envTTL     = "OUTBOX_E2E_LEASE_TTL"
	envID      = "OUTBOX_E2E_ID"
	envInFight = "OUTBOX_E2E_MAX_IN_FLIGHT"
	// envAckDelay holds each confirmed batch this long before the relay sees it, like a
	// slow acknowledgement path: the relay then nearly always holds confirmed outcomes
	// it has not recorded, which a freeze must get refused.
	envAckDelay = "OUTBOX_E2E_ACK_DELAY"
)

// slowAcks delays the confirmations of a publisher.
type slowAcks struct {
	outbox.Publisher
	delay time.Duration
}

func (s slowAcks) Publish(ctx context.Context, batch []*outbox.Message) []error {
	errs := s.Publisher.Publish(ctx, batch)
	time.Sleep(s.delay)
	return errs
}

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(childRelay())
	}
	os.Exit(m.Run())
}

// childRelay runs a relay until SIGTERM, logging JSON to stderr.
func childRelay() int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, testdb.URL())
	if err != nil {
		log.Error("pool", "err", err)
		return 1
	}
	defer pool.Close()
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: os.Getenv(envSchema)})
	if err != nil {
		log.Error("driver", "err", err)
		return 1
	}
	pub, err := outboxnats.Dial(ctx, os.Getenv(envNATS), outboxnats.Config{Route: os.Getenv(envPrefix) + "{topic}"})
	if err != nil {
		log.Error("nats", "err", err)
		return 1
	}
	defer pub.Close()
	ttl, _ := time.ParseDuration(os.Getenv(envTTL))
	inFlight, _ := strconv.Atoi(os.Getenv(envInFight))
	var publisher outbox.Publisher = pub
	if d, _ := time.ParseDuration(os.Getenv(envAckDelay)); d > 0 {
		publisher = slowAcks{Publisher: pub, delay: d}
	}
	r, err := outbox.NewRelay(drv, publisher, outbox.RelayConfig{
		ID: os.Getenv(envID), LeaseTTL: ttl, MaxInFlight: inFlight, PublishBatchSize: min(250, max(inFlight, 1)),
		PollInterval: 100 * time.Millisecond, OutageMinDelay: 50 * time.Millisecond, OutageMaxDelay: time.Second,
		Logger: log,
	})
	if err != nil {
		log.Error("relay", "err", err)
		return 1
	}
	if err := r.Run(ctx, 10*time.Second); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

// env is one test's world: a schema, a stream, and the child relays.
type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	drv      *outboxpgx.Driver
	schema   string
	natsURL  string
	js       jetstream.JetStream
	stream   string
	prefix   string
	ttl      time.Duration
	inFlight int
	ackDelay time.Duration // for relays started from now on
	w        *outbox.Writer[pgx.Tx]
}

func newEnv(t *testing.T, natsURL string, js jetstream.JetStream, stream, prefix string) *env {
	pool, drv, schema := testdb.Setup(t)
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, drv: drv, schema: schema, natsURL: natsURL, js: js, stream: stream, prefix: prefix,
		ttl: 3 * time.Second, inFlight: 500, w: w}
}

// child is a relay process.
type child struct {
	id     string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
}

// syncBuffer is the output of a command the test reads while it is written.
type syncBuffer = testenv.Buffer

func (e *env) startRelay(id string) *child {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envSchema+"="+e.schema, envNATS+"="+e.natsURL,
		envPrefix+"="+e.prefix, envTTL+"="+e.ttl.String(), envID+"="+id, envInFight+"="+strconv.Itoa(e.inFlight),
		envAckDelay+"="+e.ackDelay.String())
	c := &child{id: id, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	e.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(15 * time.Second): // cleanup only: a relay slow to stop is killed, no verdict
			_ = cmd.Process.Kill()
			<-c.done
		}
		if e.t.Failed() {
			e.t.Logf("relay %s log:\n%s", id, tail(c.stderr.String(), 40))
		}
	})
	return c
}

// leaseTrouble counts what the relay logged of leases lost so far, each a loss a loaded
// machine may add to a fault's, with messages in flight that another relay (or the relay
// itself, under a new token) publishes again:
//   - a failed renewal (logged at the first of a run of failures, and once per 10 s
//     after): a renewal may take a third of the lease TTL, 1 s with these tests' short
//     TTL, and after a few failures the leases run out;
//   - a "leases changed" line with shards lost, unless it is a plain give-back: a relay
//     descheduled past its TTL loses shards without any renewal failing, and this line is
//     then the only trace. A relay that gives back its excess for a rebalance (nothing
//     gained, and still holding its fair share) loses nothing in flight: it releases a
//     shard only once nothing of it is in flight, so that is not counted.
func (c *child) leaseTrouble() int {
	n := 0
	for _, line := range strings.Split(c.stderr.String(), "\n") {
		var rec struct {
			Msg          string
			Held, Target int
			Gained, Lost string
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(rec.Msg, "lease renewal failed"):
			n++
		case rec.Msg == "leases changed" && rec.Lost != "" && rec.Lost != "[]":
			if giveBack := rec.Gained == "[]" && rec.Held >= rec.Target; !giveBack {
				n++
			}
		}
	}
	return n
}

// checkDuplicates fails the test when the run has more duplicates than MaxInFlight per
// lease loss: the fault's own, plus extra, the losses a loaded machine may add (see
// leaseTrouble). Usually extra is 0, and the bound is what the fault had in flight.
func (e *env) checkDuplicates(rep report, extra int) {
	e.t.Helper()
	if bound := e.inFlight * (1 + extra); rep.dup > bound {
		e.t.Fatalf("%d duplicates, more than MaxInFlight (%d) times the lease losses (the fault, and %d failed renewals or leases lost)",
			rep.dup, e.inFlight, extra)
	}
	if extra > 0 {
		e.t.Logf("%d failed renewals or leases lost: the duplicate bound is %d", extra, e.inFlight*(1+extra))
	}
}

func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to relay %s: %v", sig, c.id, err)
	}
}

func tail(s string, lines int) string {
	sc := bufio.NewScanner(bytes.NewBufferString(s))
	var out []string
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	if len(out) > lines {
		out = out[len(out)-lines:]
	}
	var b bytes.Buffer
	for _, l := range out {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// load commits (and sometimes rolls back) events over keys until stopped. Each key is
// owned by one goroutine, so its writes are serialized as an application holding the
// aggregate's lock would serialize them.
type load struct {
	e          *env
	committed  atomic.Int64
	rolledBack sync.Map // event id -> true
	stop       chan struct{}
	done       sync.WaitGroup
}

func (e *env) startLoad(writers, keysPerWriter int, rate time.Duration, maxEvents int64) *load {
	l := &load{e: e, stop: make(chan struct{})}
	for w := 0; w < writers; w++ {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 42))
			ctx := context.Background()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				if maxEvents > 0 && l.committed.Load() >= maxEvents {
					return
				}
				n := 1 + rnd.IntN(5)
				msgs := make([]outbox.Message, n)
				for j := range msgs {
					key := fmt.Sprintf("w%d-k%d", w, rnd.IntN(keysPerWriter))
					msgs[j] = outbox.Message{Topic: "orders", Key: key, EventType: "e", Payload: []byte(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))}
					msgs[j].ID = outbox.NewID()
				}
				rollback := rnd.IntN(10) == 0
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if err := e.w.Write(ctx, tx, msgs...); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				switch {
				case errors.Is(err, errRollback):
					for _, m := range msgs {
						l.rolledBack.Store(m.ID, true)
					}
				case err != nil:
					e.t.Errorf("writer %d: %v", w, err)
					return
				default:
					l.committed.Add(int64(n))
				}
				if rate > 0 {
					time.Sleep(rate)
				}
			}
		}()
	}
	return l
}

var errRollback = errors.New("rolled back on purpose")

// writeBacklog commits n events over keys in transactions of 5,000, before any relay runs.
func (e *env) writeBacklog(n, keys int) {
	e.t.Helper()
	ctx := context.Background()
	for from := 0; from < n; from += 5000 {
		msgs := make([]outbox.Message, 0, 5000)
		for i := from; i < min(from+5000, n); i++ {
			msgs = append(msgs, outbox.Message{Topic: "orders", Key: fmt.Sprintf("backlog-k%d", i%keys), Payload: []byte(strconv.Itoa(i))})
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return e.w.Write(ctx, tx, msgs...) }); err != nil {
			e.t.Fatal(err)
		}
	}
}

// published counts the messages the stream holds.
func (e *env) published() uint64 {
	e.t.Helper()
	ctx, cancel := testenv.CallContext() // bounds a hang
	defer cancel()
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func (l *load) finish() {
	close(l.stop)
	l.done.Wait()
}

// waitDrained waits until nothing is pending, for as long as the pending count moves.
func (e *env) waitDrained() {
	e.t.Helper()
	q := fmt.Sprintf(`SELECT count(*) FROM "%s".outbox`, e.schema)
	testenv.Await(e.t, "the relays to drain the outbox", func() (any, bool) {
		var pending int
		if err := e.pool.QueryRow(context.Background(), q).Scan(&pending); err != nil {
			e.t.Fatal(err)
		}
		return fmt.Sprintf("%d pending", pending), pending == 0
	})
}

// report is the checker's verdict on one run.
type report struct {
	committed, delivered, lost, phantom, order, dup, dead int
}

func (r report) String() string {
	return fmt.Sprintf("committed=%d delivered=%d lost=%d phantom=%d order=%d dup=%d dead=%d",
		r.committed, r.delivered, r.lost, r.phantom, r.order, r.dup, r.dead)
}

// check reads the stream back completely and compares it with the database: every
// committed event delivered (lost), nothing else delivered (phantom), per key the first
// deliveries in write order (order), and duplicates counted.
func (e *env) check(l *load) report {
	e.t.Helper()
	ctx := testenv.Context(e.t) // for the set-up calls, each prompt; the read below has its stall detector
	type row struct {
		seq int64
		key string
	}
	truth := map[outbox.ID]row{}
	var dead int
	// Every committed message is in exactly one of the three tables.
	rows, err := e.pool.Query(ctx, fmt.Sprintf(`SELECT id, seq, key, false FROM "%[1]s".outbox
UNION ALL SELECT id, seq, key, false FROM "%[1]s".outbox_published
UNION ALL SELECT id, seq, key, true FROM "%[1]s".outbox_dead`, e.schema))
	if err != nil {
		e.t.Fatal(err)
	}
	for rows.Next() {
		var id [16]byte
		var r row
		var isDead bool
		if err := rows.Scan(&id, &r.seq, &r.key, &isDead); err != nil {
			e.t.Fatal(err)
		}
		if isDead {
			dead++
			continue
		}
		truth[outbox.ID(id)] = r
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}

	// Full read: an ordered consumer from the first message to the last one stored.
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	total := info.State.Msgs
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	rep := report{committed: len(truth), dead: dead}
	seen := map[outbox.ID]int{}
	last := map[string]int64{}
	// A fetch that brings nothing, or fails (a consumer reset that timed out on a loaded
	// machine), is tried again; only a read that stops moving is a failure.
	var lastErr error
	progressed := time.Now()
	for read := uint64(0); read < total; {
		if time.Since(progressed) > testenv.Stall() { // a stall detector, not a budget
			e.t.Fatalf("invalid run: could not read the stream back completely (%d of %d): no message for %v (last error: %v)",
				read, total, testenv.Stall(), lastErr)
		}
		batch, err := cons.Fetch(int(min(total-read, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond) // paces the retries
			continue
		}
		for msg := range batch.Messages() {
			read++
			progressed = time.Now()
			id, err := outbox.ParseID(msg.Headers().Get(outbox.HeaderID))
			if err != nil {
				e.t.Fatalf("message without a valid %s header: %v", outbox.HeaderID, err)
			}
			rep.delivered++
			seen[id]++
			if seen[id] > 1 {
				rep.dup++
				continue
			}
			r, ok := truth[id]
			if !ok {
				if _, rb := l.rolledBack.Load(id); rb {
					e.t.Errorf("phantom: event %s of a rolled-back transaction was published", id)
				}
				rep.phantom++
				continue
			}
			if r.seq < last[r.key] {
				rep.order++
				if rep.order <= 5 {
					var a, b time.Time
					_ = e.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT (SELECT published_at FROM "%[1]s".outbox_published WHERE seq = $1), (SELECT published_at FROM "%[1]s".outbox_published WHERE seq = $2)`, e.schema), r.seq, last[r.key]).Scan(&a, &b)
					e.t.Logf("order violation: key %s: seq %d delivered after seq %d (stream seq %d); recorded at %s and %s", r.key, r.seq, last[r.key], meta(msg), a.Format("15:04:05.000"), b.Format("15:04:05.000"))
				}
			}
			last[r.key] = r.seq
		}
		if err := batch.Error(); err != nil {
			lastErr = err
		}
	}
	for id := range truth {
		if seen[id] == 0 {
			rep.lost++
		}
	}
	return rep
}

func meta(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// leaseOwners returns how many shard leases each live relay holds (a lease lives by its
// owner's heartbeat).
func (e *env) leaseOwners() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	rows, err := e.pool.Query(context.Background(),
		fmt.Sprintf(`SELECT l.owner, count(*) FROM "%[1]s".outbox_leases l JOIN "%[1]s".outbox_relays r ON r.id = l.owner
WHERE r.expires_at > now() GROUP BY l.owner`, e.schema))
	if err != nil {
		e.t.Fatal(err)
	}
	for rows.Next() {
		var owner string
		var n int
		if err := rows.Scan(&owner, &n); err != nil {
			e.t.Fatal(err)
		}
		out[owner] = n
	}
	return out
}
