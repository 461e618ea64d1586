package outboxredis_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "outboxredis test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a certificate for 127.0.0.1 signed by ca, usable by servers and clients.
func (ca *testCA) issue(t *testing.T, serial int64) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// writePEM writes c's certificate and key, and the CA, as PEM files in dir.
func writePEM(t *testing.T, dir string, ca *testCA, c tls.Certificate) (certFile, keyFile, caFile string) {
	t.Helper()
	keyDER, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("server.crt", "CERTIFICATE", c.Certificate[0]),
		write("server.key", "EC PRIVATE KEY", keyDER),
		write("ca.crt", "CERTIFICATE", ca.cert.Raw)
}

func TestDialTLS(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	dir := t.TempDir()
	certFile, keyFile, caFile := writePEM(t, dir, ca, ca.issue(t, 2))
	tlsPort := freePort(t)
	startServer(t, "--tls-port", tlsPort, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes")
	url := "rediss://127.0.0.1:" + tlsPort
	client := ca.issue(t, 3)

	pub, err := outboxredis.Dial(testenv.Context(t), url, outboxredis.Config{
		Route: "events",
		TLS:   &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{client}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf("t", 3)))

	for name, cfg := range map[string]*tls.Config{
		"system roots":          nil, // the test CA is not among them
		"no client certificate": {RootCAs: ca.pool},
	} {
		if _, err := outboxredis.Dial(testenv.Context(t), url, outboxredis.Config{TLS: cfg}); err == nil {
			t.Errorf("%s: Dial succeeded", name)
		} else if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: Dial error %q does not say what is wrong with the certificates", name, err)
		}
	}
}
