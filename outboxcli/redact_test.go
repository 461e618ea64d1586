package outboxcli

import (
	"bytes"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
)

const canary = "s3cr3t-CANARY-7f1c"

// canaryDSNs put the canary everywhere a PostgreSQL connection string can carry a
// secret. Each points at a port nothing listens on.
var canaryDSNs = []string{
	"postgres://app:" + canary + "@127.0.0.1:1/orders?sslmode=disable",
	"postgresql://app:" + url.QueryEscape(canary+"/?#@") + "@127.0.0.1:1/orders?sslmode=disable",
	"postgres://app@127.0.0.1:1/orders?sslmode=disable&password=" + canary,
	"postgres://app@127.0.0.1:1/orders?sslmode=require&sslpassword=" + canary + "&sslkey=" + canary + "-key",
	"host=127.0.0.1 port=1 user=app password=" + canary + " dbname=orders sslmode=disable",
	"host=127.0.0.1 port=1 user=app password='" + canary + " with spaces' dbname=orders sslmode=disable",
	"host=127.0.0.1 port = 1 user=app password = " + canary + " dbname=orders sslmode=disable",
	// Unparseable: pgx's error would quote these.
	"postgres://app:" + canary + "@127.0.0.1:1/orders?sslmode=bogus",
	"postgres://app:" + canary + "%zz@127.0.0.1:1/orders",
	"postgres://app:" + canary + "@127.0.0.1:notaport/orders",
	"host=127.0.0.1 password='" + canary,
	"host=127.0.0.1 port=1 password=" + canary + " dbname=orders sslmode=nonsense",
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, dsn := range canaryDSNs {
		got := redactDSN(dsn)
		if strings.Contains(got, "CANARY") {
			t.Errorf("redactDSN(%q) = %q: the secret shows", dsn, got)
		}
		if _, err := parseDSN(dsn); err == nil && (!strings.Contains(got, "127.0.0.1") || !strings.Contains(got, "orders")) {
			t.Errorf("redactDSN(%q) = %q: lost the host or database", dsn, got)
		}
	}
	for in, want := range map[string]string{
		"postgres://app:pw@db.internal:5433/orders?sslmode=verify-full&application_name=billing&password=x": "postgres://app:REDACTED@db.internal:5433/orders?application_name=billing&password=REDACTED&sslmode=verify-full",
		"postgres://localhost/postgres":                                 "postgres://localhost/postgres",
		"postgres://h1:5432,h2:5433/db?target_session_attrs=read-write": "postgres://h1:5432,h2:5433/db?target_session_attrs=read-write",
		"host=db user=app password='p w' dbname=orders":                 "dbname=orders host=db password=REDACTED user=app",
		"host=db options='-c search_path=x' sslkey=/k.pem passfile=/p":  "host=db options=REDACTED passfile=REDACTED sslkey=REDACTED",
		"user=app application_name='my app'":                            "application_name='my app' user=app",
	} {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q)\n got %q\nwant %q", in, got, want)
		}
	}
}

func TestRedactBroker(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                                  "nats://127.0.0.1:4222",
		"nats://alice:" + canary + "@n1:4222,nats://n2:4222":     "nats://alice:REDACTED@n1:4222,nats://n2:4222",
		"nats://" + canary + "@n1:4222":                          "nats://REDACTED@n1:4222", // token authentication
		"nats://n1:4222/path?x=" + canary:                        "nats://n1:4222",
		"nats://a:" + canary + "%zz@n1":                          "(unparseable URL, not shown)",
		"kafka://k1:9092,k2:9092":                                "kafka://k1:9092,k2:9092",
		"kafka://k1:9092,u:" + canary + "@k2:9092/x?y=" + canary: "kafka://k1:9092,REDACTED@k2:9092",
		"sqs://?region=eu-west-1&secret_key=" + canary:           "sqs://",
	} {
		if got := redactBroker(in); got != want {
			t.Errorf("redactBroker(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestScrubWriter(t *testing.T) {
	t.Parallel()
	sec := &secrets{}
	sec.add(canary+"/?#@", "abc") // too short to scrub without mangling output
	var buf bytes.Buffer
	w := &scrubWriter{w: &buf, secrets: sec}
	msg := "a=" + canary + "/?#@ b=" + url.QueryEscape(canary+"/?#@") + " c=" + url.PathEscape(canary+"/?#@") + " abc\n"
	if n, err := w.Write([]byte(msg)); n != len(msg) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(msg))
	}
	if got := buf.String(); strings.Contains(got, "CANARY") || !strings.Contains(got, "a=REDACTED b=REDACTED c=REDACTED abc") {
		t.Fatalf("scrubbed to %q", got)
	}
}

// TestSecretsNeverPrinted runs commands with connection strings that carry a canary
// secret and fail (nothing listens, or the string does not parse), and checks that the
// canary appears nowhere in their output.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	commands := [][]string{{"status"}, {"migrate", "up"}, {"dead", "list"}, {"relay", "--log-format", "json"}}
	for _, dsn := range canaryDSNs {
		for _, cmd := range commands {
			for _, how := range []string{"flag", "env", "config"} {
				env := map[string]string{}
				args := append([]string(nil), cmd...)
				switch how {
				case "flag":
					args = append(args, "--database-url", dsn)
				case "env":
					env["OUTBOX_DATABASE_URL"] = dsn
				case "config":
					args = append(args, "--config", writeFile(t, "c.yaml", "database-url: '"+strings.ReplaceAll(dsn, "'", "''")+"'\n"))
				}
				r := cli(t, env, args...)
				if r.code == 0 {
					t.Errorf("%v with %q (%s): succeeded against a closed port", cmd, dsn, how)
				}
				if strings.Contains(r.stdout+r.stderr, "CANARY") {
					t.Errorf("%v with %q (%s): the secret was printed: %s", cmd, dsn, how, r)
				}
			}
		}
	}
}

func TestBrokerSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	for _, broker := range []string{
		"nats://alice:" + canary + "@127.0.0.1:1",
		"nats://" + canary + "@127.0.0.1:1", // token
		"nats://127.0.0.1:1,nats://bob:" + canary + "@127.0.0.1:2",
		"nats://127.0.0.1:1?auth_token=" + canary,
		"amqp://127.0.0.1:1/?password=" + canary,
	} {
		r := cli(t, b.env, "relay", "--broker", broker)
		if r.code != 1 || strings.Contains(r.stdout+r.stderr, "CANARY") {
			t.Errorf("relay --broker %q: want exit 1 without the secret, got %s", broker, r)
		}
		if !strings.Contains(r.stderr, "127.0.0.1:1") {
			t.Errorf("relay --broker %q: the log does not say where it connected: %s", broker, r)
		}
	}
	// The database URL the relay logs is the redacted one, with host and database.
	r := cli(t, with(b.env, "OUTBOX_DATABASE_URL", strings.Replace(testdb.URL(), "postgres@", "postgres:"+canary+"@", 1)),
		"relay", "--broker", "nats://127.0.0.1:1")
	if strings.Contains(r.stdout+r.stderr, "CANARY") || !strings.Contains(r.stderr, "postgres:REDACTED@127.0.0.1:5432/test") {
		t.Errorf("relay log: %s", r)
	}
}

// FuzzRedactDSN checks that what redactDSN prints does not depend on the password at
// all, in either form of connection string, whatever bytes the password holds.
func FuzzRedactDSN(f *testing.F) {
	for _, seed := range []string{canary, "p@ss:w/rd?#", "it's \\ quoted", "", "REDACTED", " spaced out ", "%zz", "\x00\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		asURL := func(p string) string {
			return "postgres://" + url.UserPassword("app", p).String() + "@db:5432/orders?sslmode=disable&password=" + url.QueryEscape(p)
		}
		asKV := func(p string) string {
			return "host=db user=app password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(p) + "' dbname=orders"
		}
		for _, form := range []func(string) string{asURL, asKV} {
			got, want := redactDSN(form(pw)), redactDSN(form("x"))
			if got != want {
				t.Fatalf("redactDSN depends on the password %q:\n got %q\nwant %q", pw, got, want)
			}
		}
	})
}

// TestBrokerSecrets: the scrubber knows every credential a broker URL can carry, so that
// a library error quoting the URL prints none of them.
func TestBrokerSecrets(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{
		"nats://alice:" + canary + "@127.0.0.1:1",
		"nats://127.0.0.1:1?auth_token=" + canary,
		"amqp://127.0.0.1:1/?password=" + canary,
		"sqs://127.0.0.1:1/?region=eu-west-1&secret_key=" + canary,
		"https://hooks.example/services/T000/B000/" + canary,
	} {
		if got := brokerSecrets(broker); !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, canary) }) {
			t.Errorf("brokerSecrets(%q) = %q: the credential is missing", broker, got)
		}
	}
	if got := brokerSecrets("sqs://127.0.0.1:1/?region=eu-west-1"); len(got) != 0 {
		t.Errorf("brokerSecrets of a URL without credentials = %q", got)
	}
}
