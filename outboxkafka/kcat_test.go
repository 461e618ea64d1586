package outboxkafka_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxkafka"
)

// kcatRecord is a record as `kcat -J` prints it. Headers is a flat list: name,
// value, name, value, ...
type kcatRecord struct {
	Headers []string `json:"headers"`
	Key     *string  `json:"key"`
	Payload *string  `json:"payload"`
}

// kcat reads topic from the start with kcat (librdkafka), an outside client, and
// returns what it printed.
func kcat(t *testing.T, broker, topic string) []kcatRecord {
	t.Helper()
	path, err := exec.LookPath("kcat")
	if err != nil {
		t.Skip("kcat is not installed (apt-get install kcat): the read-back by an outside client is not checked")
	}
	ctx := testenv.Context(t)
	out, err := exec.CommandContext(ctx, path, "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-J", "-q").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("kcat: %v: %s", err, stderr)
	}
	var rs []kcatRecord
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r kcatRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("kcat printed %q: %v", sc.Text(), err)
		}
		rs = append(rs, r)
	}
	return rs
}

// TestKcatReadsBack publishes with every compression codec and reads the records back
// with kcat: key, payload and every header arrive as a non-Go consumer sees them.
func TestKcatReadsBack(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	for id, codec := range []string{"none", "gzip", "snappy", "lz4", "zstd"} { // in Kafka's codec id order
		t.Run(codec, func(t *testing.T) {
			t.Parallel()
			topic := tc.createTopic(t, 2, nil)
			compressed := tc.Fault(kfake.Fault{ // counts the record batches compressed with codec
				Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Observe: true, Count: -1,
				When: func(req kmsg.Request) bool {
					for _, rt := range req.(*kmsg.ProduceRequest).Topics {
						for _, rp := range rt.Partitions {
							var b kmsg.RecordBatch
							if b.ReadFrom(rp.Records) == nil && int(b.Attributes&7) == id {
								return true
							}
						}
					}
					return false
				},
			})
			pub := tc.dial(t, outboxkafka.Config{Route: topic, Compression: codec})
			var batch []*outbox.Message
			for _, key := range []string{"order-1", "order-2", "order-3"} {
				m := testenv.Message("orders", key, []byte(`{"order":"`+key+`","text":"`+strings.Repeat("compressible ", 20)+`"}`))
				m.ContentType = outbox.ContentTypeJSON
				m.EventType = "order.placed"
				m.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
				batch = append(batch, m)
			}
			testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
			if compressed.Hits() == 0 {
				t.Errorf("no record batch was compressed with %s", codec)
			}

			got := kcat(t, tc.seeds[0], topic)
			if len(got) != len(batch) {
				t.Fatalf("kcat read %d records, want %d", len(got), len(batch))
			}
			byKey := map[string]kcatRecord{}
			for _, r := range got {
				if r.Key == nil {
					t.Fatalf("kcat read a record without a key: %+v", r)
				}
				byKey[*r.Key] = r
			}
			for _, m := range batch {
				r, ok := byKey[m.Key]
				if !ok {
					t.Errorf("kcat did not read key %s", m.Key)
					continue
				}
				if r.Payload == nil || *r.Payload != string(m.Payload) {
					t.Errorf("key %s: payload %v, want %s", m.Key, r.Payload, m.Payload)
				}
				want := map[string]string{}
				m.WireHeaders(func(k, v string) { want[k] = v })
				if len(r.Headers) != 2*len(want) {
					t.Errorf("key %s: headers %q, want %d", m.Key, r.Headers, len(want))
					continue
				}
				for i := 0; i < len(r.Headers); i += 2 {
					if k, v := r.Headers[i], r.Headers[i+1]; want[k] != v {
						t.Errorf("key %s: header %s = %q, want %q", m.Key, k, v, want[k])
					}
				}
			}
		})
	}
}
