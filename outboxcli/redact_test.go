package outboxcli

import (
	"bytes"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
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

func TestScrubWriter(t *testing.T) {
	t.Parallel()
	sec := &secrets{}
	pw := canary + "/?#@"
	sec.addDSN("postgres://app:" + url.QueryEscape(pw) + "@db/orders?sslpassword=" + url.QueryEscape(pw))
	sec.addBroker("nats://bob:ab@n1:4222") // two characters: still a credential
	var buf bytes.Buffer
	w := &scrubWriter{w: &buf, secrets: sec}
	// The spellings a library may print: as written, as Go encodes a URL, decoded.
	msg := "a=postgres://app:" + url.QueryEscape(pw) + "@db b=" + url.UserPassword("app", pw).String() + "@db c=app:" + pw + "@db" +
		" d=sslpassword=" + url.QueryEscape(pw) + "&x e=sslpassword=" + pw + " f=nats://bob:ab@n1 abc ab\n"
	if n, err := w.Write([]byte(msg)); n != len(msg) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(msg))
	}
	want := "a=postgres://app:REDACTED@db b=app:REDACTED@db c=app:REDACTED@db d=sslpassword=REDACTED&x e=sslpassword=REDACTED f=nats://bob:REDACTED@n1 abc ab\n"
	if got := buf.String(); got != want {
		t.Fatalf("scrubbed to\n %q\nwant %q", got, want)
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
		if got := brokerSecrets(broker); !slices.ContainsFunc(got, func(c credential) bool { return strings.Contains(c.find, canary) }) {
			t.Errorf("brokerSecrets(%q) = %v: the credential is missing", broker, got)
		}
	}
	if got := brokerSecrets("sqs://127.0.0.1:1/?region=eu-west-1"); len(got) != 0 {
		t.Errorf("brokerSecrets of a URL without credentials = %v", got)
	}
}

// TestScrubByStructure: a credential is redacted where it stands as one, whatever its
// length, and nowhere else: a password "dead" leaves the word dead, /dead links and a
// deadline alone (it once turned them into REDACTED, which told the password).
func TestScrubByStructure(t *testing.T) {
	t.Parallel()
	sec := &secrets{}
	sec.addDSN("postgres://app:dead@db:5432/orders?sslmode=disable")
	sec.addDSN("host=db user=app password=pw sslpassword='k y'")
	sec.addDSN("app2:my@tcp(db:3306)/app?parseTime=true") // a MySQL driver DSN
	sec.addBroker("nats://alice:dead@n1:4222,nats://tk@n2:4222")
	sec.addBroker("amqp://127.0.0.1:5672/?password=ab&heartbeat=10")
	sec.addBroker("https://hooks.example/services/T000/XY?code=q1")
	sec.addOpaque("kafka-sasl-password", "dead")
	for in, want := range map[string]string{
		// Untouched: the secrets as ordinary words.
		"the dead letter at /dead/0190 missed its deadline; dead list": "the dead letter at /dead/0190 missed its deadline; dead list",
		"pw ab tk q1 k y XY /services/T000 hooks.example":              "pw ab tk q1 k y XY /services/T000 hooks.example",
		"password=deadline password=abc code=q12":                      "password=deadline password=abc code=q12",
		// Redacted: where they are credentials.
		"dial postgres://app:dead@db:5432/orders: refused, dead":    "dial postgres://app:REDACTED@db:5432/orders: refused, dead",
		"nats: nats://alice:dead@n1:4222 and nats://tk@n2:4222":     "nats: nats://alice:REDACTED@n1:4222 and nats://REDACTED@n2:4222",
		"parse host=db user=app password=pw sslpassword='k y'":      "parse host=db user=app password=REDACTED sslpassword=REDACTED",
		"amqp://127.0.0.1:5672/?password=ab&heartbeat=10":           "amqp://127.0.0.1:5672/?password=REDACTED&heartbeat=10",
		"open app2:my@tcp(db:3306)/app: my":                         "open app2:REDACTED@tcp(db:3306)/app: my",
		`Post "https://hooks.example/services/T000/XY/e?code=q1"`:   `Post "https://hooks.example/REDACTED/e?code=REDACTED"`,
		"auth failed for password dead; --kafka-sasl-password=dead": "auth failed for password REDACTED; --kafka-sasl-password=REDACTED",
	} {
		if got := sec.scrub(in); got != want {
			t.Errorf("scrub(%q)\n got %q\nwant %q", in, got, want)
		}
	}
	// An opaque secret long enough to be no word goes wherever it appears.
	sec.addOpaque("webhook-secret", "0123456789abcdef-signing")
	if got := sec.scrub("key 0123456789abcdef-signing!"); got != "key REDACTED!" {
		t.Errorf("a long opaque secret: %q", got)
	}
}

// TestShortPasswordsByStructure runs `outbox dead show` with a database password of four
// and of two characters, on a dead letter whose payload uses the word and whose last
// error quotes the connection string: the error shows the password redacted, the
// payload and the command's own words are untouched.
func TestShortPasswordsByStructure(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	for _, password := range []string{"dead", "pw"} {
		dsn := withPassword(t, password)
		m := outbox.Message{ID: outbox.NewID(), Topic: "orders", Payload: []byte(`{"state":"dead","link":"/dead/1","pw":"` + password + `"}`)}
		b.Write(t, m)
		b.Kill(t, m.ID, 3, "dial "+dsn+": auth failed for password "+password, time.Minute)
		r := must(t, 0, with(b.env, "OUTBOX_DATABASE_URL", dsn), "dead", "show", m.ID.String())
		for _, s := range []string{string(m.Payload), ":REDACTED@", "auth failed for password REDACTED"} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("password %q: the output lacks %q:\n%s", password, s, r)
			}
		}
		if strings.Contains(r.stdout, ":"+password+"@") || strings.Contains(r.stdout, "password "+password) {
			t.Errorf("password %q shows where it is a credential:\n%s", password, r)
		}
	}
	// The console's links to /dead survive a password "dead".
	base, _ := startConsole(t, with(b.env, "OUTBOX_DATABASE_URL", withPassword(t, "dead")), "--http-addr", "127.0.0.1:0")
	if status, _, body := httpGet(t, base+"/dead"); status != http.StatusOK || !strings.Contains(body, `href="/dead/`) || strings.Contains(body, "/REDACTED") {
		t.Errorf("console with password dead: status %d:\n%s", status, body)
	}
}

// FuzzScrub: whatever the password, token, query secret or webhook path token, and
// wherever a library quotes the URL, the scrubbed text does not hold the secret
// (unless the text around it does: a password "app" is also the user name), and equals
// the text with REDACTED in the secret's place; the secret as an ordinary word is left
// alone.
func FuzzScrub(f *testing.F) {
	for _, seed := range []string{canary, "dead", "pw", "a", "p@ss:w/rd?#", "it's \\ quoted", "REDACTED", " spaced ", "%zz", "\x00\xff", "x&y=z", "é"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, secret string) {
		if secret == "" {
			return
		}
		const before, after = "<< ", " >>"
		type form struct {
			name     string
			register func(*secrets, string)
			quote    func(string) string // the text a library prints, around the secret
		}
		forms := []form{
			{"DSN password", (*secrets).addDSN, func(s string) string {
				return "postgres://" + url.UserPassword("app", s).String() + "@db:5432/orders?sslmode=disable"
			}},
			{"DSN query password", (*secrets).addDSN, func(s string) string {
				return "postgres://app@db:5432/orders?password=" + url.QueryEscape(s) + "&sslmode=disable"
			}},
			{"key=value password", (*secrets).addDSN, func(s string) string {
				return "host=db user=app password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "' dbname=orders"
			}},
			{"broker password", (*secrets).addBroker, func(s string) string {
				return "amqp://" + url.UserPassword("app", s).String() + "@mq:5672/vhost"
			}},
			{"NATS token", (*secrets).addBroker, func(s string) string { return "nats://" + url.User(s).String() + "@n1:4222" }},
			{"query token", (*secrets).addBroker, func(s string) string { return "nats://n1:4222?auth_token=" + url.QueryEscape(s) }},
			{"webhook path token", (*secrets).addBroker, func(s string) string {
				return "https://hooks.example/services/" + url.PathEscape(s)
			}},
		}
		for _, fm := range forms {
			if strings.Contains(fm.quote("x"), secret) && fm.name != "key=value password" {
				continue // the text around the secret holds it: nothing to tell apart
			}
			sec := &secrets{}
			fm.register(sec, fm.quote(secret))
			in := before + fm.quote(secret) + after
			got := sec.scrub(in)
			var want string
			switch fm.name {
			case "webhook path token":
				want = before + "https://hooks.example/" + redacted + after
			case "key=value password":
				want = before + "host=db user=app password=" + redacted + " dbname=orders" + after
			default:
				want = before + strings.Replace(fm.quote("\x00"), url.QueryEscape("\x00"), redacted, 1) + after
			}
			if strings.Contains(want, secret) {
				continue // the secret is part of the text around it
			}
			if strings.Contains(got, secret) || got != want {
				t.Errorf("%s %q: scrubbed\n %q\nto %q\nwant %q", fm.name, secret, in, got, want)
			}
			// The secret as a word of the output stays: structure, not string search.
			if word := before + secret + after; sec.scrub(word) != word {
				t.Errorf("%s %q: the bare word was changed: %q", fm.name, secret, sec.scrub(word))
			}
		}
	})
}
