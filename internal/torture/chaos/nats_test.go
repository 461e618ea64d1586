package chaos

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testdb"
	"github.com/outboxkit/outbox/internal/testnats"
	"github.com/outboxkit/outbox/internal/testproxy"
	"github.com/outboxkit/outbox/internal/torture"
	"github.com/outboxkit/outbox/internal/torture/nemesis"
)

// The fault kinds of a NATS run; every run injects each at least once.
const (
	kindRelayKill   = "relay-kill"
	kindRelayStop   = "relay-stop"
	kindNATSRestart = "nats-restart"
	kindBrokerCut   = "broker-cut"
	kindPGTerminate = "pg-terminate"
)

var allKinds = []string{kindRelayKill, kindRelayStop, kindNATSRestart, kindBrokerCut, kindPGTerminate}

const (
	leaseTTL    = 3 * time.Second
	maxInFlight = 500
	maxAttempts = 3
	streamName  = "TORTURE"
	subjectRoot = "torture"
)

// seed returns OUTBOX_TORTURE_SEED, or a random seed.
func seed(t *testing.T) uint64 {
	if s := os.Getenv("OUTBOX_TORTURE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("OUTBOX_TORTURE_SEED=%q: %v", s, err)
		}
		return v
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

func artifacts(t *testing.T) string {
	dir := os.Getenv("OUTBOX_TORTURE_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+time.Now().UTC().Format("20060102T150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTortureNATS runs the workload against 1 and 3 relay processes publishing to a
// private NATS JetStream server, while the nemesis kills, pauses and cuts off relays,
// restarts the broker and terminates the relays' database sessions; then it checks the
// complete read-back. Replay a failure with OUTBOX_TORTURE_SEED.
func TestTortureNATS(t *testing.T) {
	for _, relays := range []int{1, 3} {
		t.Run(fmt.Sprintf("relays=%d", relays), func(t *testing.T) {
			dur := 45 * time.Second
			if testing.Short() {
				dur = 12 * time.Second
			}
			runNATS(t, relays, dur, seed(t))
		})
	}
}

func runNATS(t *testing.T, relays int, dur time.Duration, seed uint64) {
	t.Logf("seed=%d (replay with OUTBOX_TORTURE_SEED=%d)", seed, seed)
	dir := artifacts(t)
	ctx := context.Background()

	// Broker: a private server (restarts must not touch the shared one) with a file
	// stream, so a restart keeps what was acknowledged; relays reach it through a proxy.
	srv := testnats.StartServer(t)
	{
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{subjectRoot + ".>"},
			Storage: jetstream.FileStorage, MaxMsgSize: 1 << 20})
		cancel()
		nc.Close()
		if err != nil {
			t.Fatalf("create stream: %v", err)
		}
	}
	proxy := testproxy.New(t, strings.TrimPrefix(srv.URL(), "nats://"))

	// Database: a fresh migrated schema and the business tables.
	db := testdb.Migrated(t)
	connect := func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, testdb.URL()) }
	{
		conn, err := connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = torture.Prepare(ctx, conn, db.Schema, torture.KeysDefault)
		_ = conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	rcfg := relayConfig{schema: db.Schema, broker: "nats://" + proxy.Addr(), route: subjectRoot + ".{topic}",
		appName: "torture-relay-" + hex.EncodeToString(b[:]), ttl: leaseTTL, inFlight: maxInFlight, maxAttempts: maxAttempts}
	rs := make([]*relay, relays)
	for i := range rs {
		rs[i] = startRelay(t, rcfg, i+1)
	}
	sampler := make(chan struct{})
	samplerDone := make(chan struct{})
	go func() { // peak RSS: VmHWM of every incarnation, sampled while it lives
		defer close(samplerDone)
		tk := time.NewTicker(250 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-sampler:
				return
			case <-tk.C:
				for _, r := range rs {
					r.sample()
				}
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-sampler:
		default:
			close(sampler)
		}
		<-samplerDone
	})

	// The workload.
	h := &torture.History{}
	wl, err := torture.StartWorkload(ctx, torture.WorkloadConfig{Connect: connect, Schema: db.Schema, Writers: 8,
		Rate: 300, PoisonShare: 0.002, Seed: seed}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wl.Stop(context.Background()) })

	// The nemesis.
	nlog, err := os.Create(filepath.Join(dir, "nemesis.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nlog.Close() }) // after the nemesis's own cleanup, which may still log
	pick := func(rnd *mrand.Rand) *relay { return rs[rnd.IntN(len(rs))] }
	faults := []nemesis.Fault{
		{Kind: kindRelayKill, MinHold: 200 * time.Millisecond, MaxHold: time.Second,
			Inject: func(rnd *mrand.Rand) (string, func() error, error) {
				r := pick(rnd)
				id := r.sigkill()
				return id, r.start, nil
			}},
		{Kind: kindRelayStop, MinHold: leaseTTL + time.Second, MaxHold: 2 * leaseTTL,
			Inject: func(rnd *mrand.Rand) (string, func() error, error) {
				r := pick(rnd)
				id, err := r.signal(syscall.SIGSTOP)
				return id, func() error { _, err := r.signal(syscall.SIGCONT); return err }, err
			}},
		{Kind: kindNATSRestart, MinHold: 200 * time.Millisecond, MaxHold: 1500 * time.Millisecond,
			Inject: func(*mrand.Rand) (string, func() error, error) {
				srv.Stop()
				return "nats " + srv.URL(), func() error { srv.Start(); return nil }, nil
			}},
		{Kind: kindBrokerCut, MinHold: time.Second, MaxHold: 4 * time.Second,
			Inject: func(*mrand.Rand) (string, func() error, error) {
				proxy.Cut()
				return "proxy " + proxy.Addr(), func() error { proxy.Restore(t); return nil }, nil
			}},
		{Kind: kindPGTerminate,
			Inject: func(*mrand.Rand) (string, func() error, error) {
				var n int
				err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()) k`, rcfg.appName).Scan(&n)
				return fmt.Sprintf("%s sessions=%d", rcfg.appName, n), nil, err
			}},
	}
	nem := nemesis.Start(nemesis.Config{Seed: seed, Faults: faults, MinGap: 300 * time.Millisecond, MaxGap: 1500 * time.Millisecond,
		Log: nlog, Logf: t.Logf})
	t.Cleanup(nem.Stop) // heals whatever is in progress, even on failure

	start := time.Now()
	time.Sleep(dur)
	select { // every kind at least once
	case <-nem.RoundDone():
	case <-time.After(2 * time.Minute):
		t.Errorf("the nemesis did not finish a round of every fault kind within 2 minutes of the run's end")
	}
	nem.Stop()
	for _, r := range rs { // a relay that exited on its own (it should not) comes back for the drain
		if r.exited() {
			t.Errorf("relay %s exited on its own:\n%s", r.id(), tail(r.stderr.String(), 20))
			if err := r.start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := wl.Stop(stopCtx); err != nil {
		t.Logf("workload: %v", err)
	}
	cancel()
	writing := time.Since(start)
	kinds := nem.Kinds()
	for _, k := range allKinds {
		if kinds[k] == 0 {
			t.Errorf("the nemesis never injected %s (injected: %v)", k, kinds)
		}
	}
	for _, rec := range nem.Records() {
		if rec.Err != "" {
			t.Errorf("fault %s on %s at %s failed: %s", rec.Kind, rec.Target, rec.Start.UTC().Format("15:04:05.000"), rec.Err)
		}
	}

	// Drain: nothing pending, within a bound.
	drainStart := time.Now()
	const drainBound = 2 * time.Minute
	var pending int
	for {
		q := fmt.Sprintf(`SELECT count(*) FROM %s.outbox`, pgx.Identifier{db.Schema}.Sanitize())
		if err := db.Pool.QueryRow(ctx, q).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Since(drainStart) > drainBound {
			t.Fatalf("run failed: %d events still pending %s after everything healed and the workload stopped: the relays did not drain", pending, drainBound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	drained := time.Now()
	recovery := drained.Sub(nem.LastHealed()).Seconds()
	for _, r := range rs {
		r.sample()
	}

	// Complete read-back.
	log := &torture.DeliveryLog{}
	readBack(t, srv.URL(), log)
	if err := log.LoadDead(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	if err := h.Resolve(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	var peak int64
	for _, r := range rs {
		peak = max(peak, r.peakKiB())
	}
	rep := torture.Check(h, log, torture.Bounds{InFlight: relays * maxInFlight, Faults: nem.Count()})
	rep.Label = "chaos nats"
	rep.Seed = seed
	rep.RecoverySeconds = recovery
	rep.RSSMiB = float64(peak) / 1024
	line := strings.Replace(rep.String(), " events=", fmt.Sprintf(" relays=%d events=", relays), 1)
	t.Logf("writing %s, drain %s, copies %d, faults %v", writing.Round(time.Millisecond), drained.Sub(drainStart).Round(time.Millisecond), rep.Copies, kinds)
	t.Log(line)
	fmt.Println(line)
	if !rep.OK() {
		for _, ex := range rep.Examples {
			t.Log(ex)
		}
		if f, err := os.Create(filepath.Join(dir, "history.jsonl")); err == nil {
			_ = h.WriteJSONL(f)
			_ = f.Close()
		}
		t.Errorf("run failed (seed %d, artifacts in %s)", seed, dir)
	}
	if rep.Delivered == 0 {
		t.Errorf("nothing was delivered: the run proves nothing")
	}
}

// readBack reads the whole stream, from its first message to its last sequence, with an
// ordered consumer, into log. A read that does not reach the last sequence fails the
// test: such a run is invalid.
func readBack(t *testing.T, url string, log *torture.DeliveryLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, streamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := info.State.LastSeq
	if info.State.FirstSeq > 1 || info.State.Msgs != last {
		t.Fatalf("invalid run: the stream lost messages (first seq %d, last seq %d, %d messages)", info.State.FirstSeq, last, info.State.Msgs)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	for seq < last {
		batch, err := cons.Fetch(int(min(last-seq, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("invalid run: read-back stopped at stream seq %d of %d: %v", seq, last, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			md, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			seq = md.Sequence.Stream
			headers := map[string]string{}
			for k, v := range msg.Headers() {
				if len(v) > 0 {
					headers[k] = v[0]
				}
			}
			d, err := torture.ParseDelivery(headers, msg.Data())
			if err != nil {
				t.Fatalf("stream seq %d: %v", seq, err)
			}
			log.Add(d)
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("invalid run: read-back stopped at stream seq %d of %d: %v", seq, last, err)
		}
		if got == 0 {
			t.Fatalf("invalid run: read-back stopped at stream seq %d of %d", seq, last)
		}
	}
}
