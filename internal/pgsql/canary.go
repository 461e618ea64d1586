package pgsql

import (
	"os"
	"strings"
	"time"
)

// What the canaries of package broken need from the SQL (see their uses in sql.go): none
// of it runs unless the build has the outbox_broken tag and OUTBOX_BROKEN names the bug.

// SkewVar holds the relay clock's skew for the canary broken.LocalClockLeases: a
// duration for every relay ("10s"), or a comma-separated list of "id-prefix=duration",
// the first prefix of the relay's ID that matches giving its skew ("r1.=10s,r3.=-10s";
// no match, no skew).
const SkewVar = "OUTBOX_BROKEN_CLOCK_SKEW"

// ClockSetting is the transaction-local setting that carries the relay's clock to the
// lease statements under broken.LocalClockLeases.
const ClockSetting = "outbox.clock"

// relayNow is the relay's clock where the setting is set, the database's elsewhere.
const relayNow = `coalesce(nullif(current_setting('` + ClockSetting + `', true), '')::timestamptz, now())`

// relayClock rewrites a lease statement to judge time by the relay's clock.
func relayClock(sql string) string { return strings.ReplaceAll(sql, "now()", relayNow) }

// RelayClock returns the clock of relay id, skewed by SkewVar, as text for ClockSetting.
func RelayClock(id string) string {
	var skew time.Duration
	for _, e := range strings.Split(os.Getenv(SkewVar), ",") {
		prefix, d, found := strings.Cut(e, "=")
		if !found {
			prefix, d = "", e
		}
		if strings.HasPrefix(id, prefix) {
			skew, _ = time.ParseDuration(strings.TrimSpace(d))
			break
		}
	}
	return time.Now().Add(skew).Format(time.RFC3339Nano)
}
