package chaos

import (
	"math/rand/v2"
	"net"
	"net/url"
	"time"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
)

// Fault kinds of the proxies in front of the broker and of the relays' database.
const (
	KindBrokerLatency   = "broker-latency"
	KindBrokerBlackhole = "broker-blackhole"
	KindDBCut           = "db-cut"
	KindDBLatency       = "db-latency"
	KindDBBlackhole     = "db-blackhole"
)

// proxyFaults are the faults of the toxiproxy p: cut (every connection reset, new ones
// refused), latency (200 ms ± 100 ms each way) and blackhole (connections stay up,
// nothing gets through: hole is p.Blackhole or p.Silence, which says what the heal does
// to them), named cut, latency and blackhole.
func proxyFaults(tb testenv.TB, p *testproxy.Proxy, hole func(testenv.TB) func(), cut, latency, blackhole string) []nemesis.Fault {
	target := "proxy " + p.Addr()
	return []nemesis.Fault{
		{Kind: cut, MinHold: time.Second, MaxHold: 4 * time.Second,
			Inject: func(*rand.Rand) (string, func() error, error) {
				p.Cut()
				return target, func() error { p.Restore(tb); return nil }, nil
			}},
		{Kind: latency, MinHold: time.Second, MaxHold: 4 * time.Second,
			Inject: func(*rand.Rand) (string, func() error, error) {
				remove := p.Latency(tb, 200*time.Millisecond, 100*time.Millisecond)
				return target, func() error { remove(); return nil }, nil
			}},
		// Longer than the lease: a relay whose database hangs loses its shards, and its
		// late writes must be refused.
		{Kind: blackhole, MinHold: time.Second, MaxHold: 2 * leaseTTL,
			Inject: func(*rand.Rand) (string, func() error, error) {
				remove := hole(tb)
				return target, func() error { remove(); return nil }, nil
			}},
	}
}

// brokerProxyFaults are the broker-side proxy faults every broker offers. A broker
// blackhole's heal closes the connections that were open.
func brokerProxyFaults(tb testenv.TB, p *testproxy.Proxy) []nemesis.Fault {
	return proxyFaults(tb, p, p.Blackhole, KindBrokerCut, KindBrokerLatency, KindBrokerBlackhole)
}

// databaseProxyFaults are the faults of the proxy in front of the relays' database. The
// blackhole silences it: the connections that carried anything meanwhile never answer
// again and are never closed, so the relay has to notice them itself.
func databaseProxyFaults(tb testenv.TB, p *testproxy.Proxy) []nemesis.Fault {
	return proxyFaults(tb, p, p.Silence, KindDBCut, KindDBLatency, KindDBBlackhole)
}

// proxyDatabase puts a proxy in front of the PostgreSQL server of databaseURL.
func proxyDatabase(tb testenv.TB, databaseURL string) *testproxy.Proxy {
	u := postgresURL(tb, databaseURL)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	return testproxy.New(tb, net.JoinHostPort(host, port))
}

// viaProxy returns databaseURL going through the proxy p of its server.
func viaProxy(tb testenv.TB, p *testproxy.Proxy, databaseURL string) string {
	u := postgresURL(tb, databaseURL)
	u.Host = p.Addr()
	return u.String()
}

func postgresURL(tb testenv.TB, databaseURL string) *url.URL {
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		tb.Fatalf("chaos: the database must be given as a postgres://host:port/... URL")
	}
	return u
}
