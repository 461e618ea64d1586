package brokers

import "testing"

// canary stands for a credential: it must never survive redaction.
const canary = "s3cr3t-canary"

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
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
