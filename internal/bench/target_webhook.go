package bench

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxwebhook"
)

func init() { RegisterTarget(brokers.Webhook, openWebhook) }

// webhookSecret signs the bench's webhooks.
const webhookSecret = "outbox-bench-webhook-secret-0123456789"

// webhookTarget is a webhook receiver in this process, listening where --broker says
// (http://127.0.0.1:0 picks a free port; https:// serves a self-signed certificate that
// the clients trust). It verifies every signature and answers 204, as a receiver that
// hands events on elsewhere would; Publisher and Raw post to it over loopback.
type webhookTarget struct {
	srv  *http.Server
	base string      // the receiver's URL, with --broker's path
	tls  *tls.Config // trusts the receiver's certificate, for https
}

func openWebhook(ctx context.Context, brokerURL string) (Target, error) {
	u, err := url.Parse(brokerURL)
	if err != nil {
		return nil, errors.New("bench: --broker is not a URL")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), "0")))
	if err != nil {
		return nil, fmt.Errorf("bench: start the webhook receiver: %w", err)
	}
	t := &webhookTarget{srv: &http.Server{
		Handler: outboxwebhook.VerifyHandler([][]byte{[]byte(webhookSecret)}, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})),
		ReadHeaderTimeout: 10 * time.Second,
	}}
	if u.Scheme == "https" {
		cert, roots, err := selfSigned(u.Hostname())
		if err != nil {
			ln.Close()
			return nil, err
		}
		t.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
		t.tls = &tls.Config{RootCAs: roots}
		go func() { _ = t.srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { _ = t.srv.Serve(ln) }()
	}
	t.base = (&url.URL{Scheme: u.Scheme, Host: ln.Addr().String(), Path: u.Path}).String()
	return t, nil
}

// selfSigned makes a certificate for host, valid for a day, and a pool that trusts it.
func selfSigned(host string) (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, roots, nil
}

// Prepare has nothing to create: the route is a path under the receiver's URL.
func (t *webhookTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	return name, func() {}, nil
}

func (t *webhookTarget) config(route string) outboxwebhook.Config {
	return outboxwebhook.Config{Route: route, Secrets: [][]byte{[]byte(webhookSecret)}, TLS: t.tls}
}

// Broker signs with webhookSecret and trusts the receiver's certificate, for https.
func (t *webhookTarget) Broker() (string, brokers.Settings) {
	return t.base, brokers.Settings{TLS: t.tls, Options: map[string][]string{"webhook-secret": {webhookSecret}}}
}

// Raw posts with as many goroutines as the publisher's default concurrency, over one
// client with the publisher's transport (outboxwebhook.NewTransport: as many idle
// connections kept). The requests are built and signed by the publisher's own code
// (outboxwebhook.Publisher.Request); a message counts once answered 2xx.
func (t *webhookTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	cfg := t.config(route)
	transport := outboxwebhook.NewTransport(cfg)
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	cfg.URL, cfg.TLS = t.base, nil // New takes TLS from the client
	builder, err := outboxwebhook.New(client, cfg)
	if err != nil {
		return err
	}
	defer builder.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range outboxwebhook.MaxConcurrencyDefault {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(msgs)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				if err := rawPost(ctx, client, builder, msgs[i]); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

func rawPost(ctx context.Context, client *http.Client, builder *outboxwebhook.Publisher, m *outbox.Message) error {
	req, err := builder.Request(ctx, m)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", req.URL.Path, resp.Status)
	}
	return nil
}

func (t *webhookTarget) Close() { _ = t.srv.Close() }
