// Package testproxy puts a toxiproxy TCP proxy between a client under test and a real
// server, so a test can cut the connection (every open connection reset, new ones
// refused) and heal it, or slow it down, without touching the server.
package testproxy

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// Proxy forwards a local port to an upstream address. It is closed when the test ends.
type Proxy struct {
	p *toxiproxy.Proxy

	mu      sync.Mutex
	silence *silenceSwitch // Silence's, installed on first use
}

// New starts a proxy on a free port of 127.0.0.1 forwarding to upstream ("host:port").
func New(t testenv.TB, upstream string) *Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.New(io.Discard))
	p := toxiproxy.NewProxy(srv, t.Name(), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("testproxy: start a proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{p: p}
}

// Addr is the proxy's "host:port"; clients connect here instead of upstream.
func (p *Proxy) Addr() string { return p.p.Listen }

// Cut resets every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() { p.p.Stop() }

// Restore listens again on the same address. The port may linger a moment after Cut:
// Restore retries until the listen succeeds, and fails t when it has failed the same way
// for testenv.Stall().
func (p *Proxy) Restore(t testenv.TB) {
	t.Helper()
	if err := testenv.Progress(context.Background(), "listening again on "+p.Addr(), testenv.Stall(), func() (any, bool) {
		err := p.p.Start()
		return err, err == nil
	}); err != nil {
		t.Fatalf("testproxy: restore: %v", err)
	}
}

// Latency delays data in both directions by d (plus up to jitter) until the returned
// function is called.
func (p *Proxy) Latency(t testenv.TB, d, jitter time.Duration) (remove func()) {
	t.Helper()
	return p.toxics(t, fmt.Sprintf(`{"type":"latency","stream":%%q,"attributes":{"latency":%d,"jitter":%d}}`, d.Milliseconds(), jitter.Milliseconds()))
}

// Blackhole stops data in both directions until the returned function is called: the
// connections stay up and what is sent meanwhile is dropped. Removing it closes the
// connections that were open, so their peers see them end at the heal.
func (p *Proxy) Blackhole(t testenv.TB) (remove func()) {
	t.Helper()
	return p.toxics(t, `{"type":"timeout","stream":%q,"attributes":{"timeout":0}}`)
}

// Silence stops data in both directions until the returned function is called, like a
// network that drops packets: connections stay up, nothing sent meanwhile arrives. A
// connection that carried data while silenced never delivers anything again and is
// never closed (its peers wait for an answer that does not come, as after a partition
// that a middlebox's lost state outlives); the ones that stayed idle, and every new one
// after the heal, work.
func (p *Proxy) Silence(t testenv.TB) (restore func()) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.silence == nil {
		p.silence = &silenceSwitch{ended: make(chan struct{})}
		t.Cleanup(func() { close(p.silence.ended) })
		silencesMu.Lock()
		id := len(silences)
		silences = append(silences, p.silence)
		silencesMu.Unlock()
		_ = p.toxics(t, fmt.Sprintf(`{"type":%q,"stream":%%q,"attributes":{"switch":%d}}`, silenceToxicName, id))
	}
	p.silence.on.Store(true)
	return func() { p.silence.on.Store(false) }
}

// Partition silences the proxy for the rest of the test, and the connections that carry
// anything from now on lose their close as well: when one side closes, the other never
// hears of it (a server keeps the session of a client that went away, as it does when a
// partition outlives a firewall's state, until its TCP keepalive).
func (p *Proxy) Partition(t testenv.TB) {
	t.Helper()
	p.Silence(t)
	p.silence.keepEnds.Store(true)
}

// Silenced returns how many chunks of data Silence has dropped so far.
func (p *Proxy) Silenced() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.silence == nil {
		return 0
	}
	return p.silence.dropped.Load()
}

// toxics adds the toxic spec (with %q for the stream) in both directions.
func (p *Proxy) toxics(t testenv.TB, spec string) (remove func()) {
	t.Helper()
	var names []string
	for _, dir := range []string{"upstream", "downstream"} {
		tx, err := p.p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(spec, dir)))
		if err != nil {
			t.Fatalf("testproxy: add toxic: %v", err)
		}
		names = append(names, tx.Name)
	}
	return func() {
		for _, n := range names {
			_ = p.p.Toxics.RemoveToxic(context.Background(), n)
		}
	}
}
