package pgsql

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// ParseSnapshot parses the text form of a PostgreSQL snapshot, as pg_current_snapshot()::text
// gives it: "xmin:xmax:xip1,xip2,..." in 64-bit transaction IDs (epoch included), the
// list empty when no transaction was running ("10:10:"). It checks what
// outboxdriver.Snapshot.Finished relies on: xmin ≤ xmax, and every xip in [xmin, xmax).
func ParseSnapshot(s string) (outboxdriver.Snapshot, error) {
	bad := func(why string) (outboxdriver.Snapshot, error) {
		return outboxdriver.Snapshot{}, fmt.Errorf("snapshot %q: %s", s, why)
	}
	xmin, rest, ok1 := strings.Cut(s, ":")
	xmax, xips, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return bad(`want "xmin:xmax:xip,..."`)
	}
	var snap outboxdriver.Snapshot
	var err error
	if snap.Xmin, err = strconv.ParseUint(xmin, 10, 64); err != nil {
		return bad("xmin is not a transaction ID")
	}
	if snap.Xmax, err = strconv.ParseUint(xmax, 10, 64); err != nil {
		return bad("xmax is not a transaction ID")
	}
	if snap.Xmin > snap.Xmax {
		return bad("xmin above xmax")
	}
	if xips == "" {
		return snap, nil
	}
	for x := range strings.SplitSeq(xips, ",") {
		xip, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return bad("an xip is not a transaction ID")
		}
		if xip < snap.Xmin || xip >= snap.Xmax {
			return bad("an xip outside [xmin, xmax)")
		}
		snap.Xip = append(snap.Xip, xip)
	}
	return snap, nil
}
