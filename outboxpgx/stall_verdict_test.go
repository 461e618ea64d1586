package outboxpgx

import (
	"errors"
	"testing"
	"time"
)

// TestStallVerdict: what the watch decides of one statement from what a probe saw of
// its session, the rule for statements sent into an outage included.
func TestStallVerdict(t *testing.T) {
	t.Parallel()
	sent := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) // the probe's statement
	rtt := 5 * time.Millisecond
	const pid = 42
	idle := func(idleFor time.Duration) map[uint32]session {
		return map[uint32]session{pid: {state: "idle", idleFor: idleFor}}
	}
	for _, tc := range []struct {
		name         string
		age          time.Duration // of the statement when the probe was sent
		lost         time.Duration // how long before the probe was sent a lost probe started; 0: none lost
		sessions     map[uint32]session
		dead, unsent bool
	}{
		{"young, idle since before it was sent: may still be on its way", 100 * time.Millisecond, 0, idle(time.Second), false, false},
		{"old, idle since before it was sent: never arrived", probeAfter + 10*time.Millisecond, 0, idle(time.Second), true, true},
		{"young, sent before a lost probe, idle since before: lost with it", 100 * time.Millisecond, 60 * time.Millisecond, idle(time.Second), true, true},
		{"young, sent after the lost probe: may still be on its way", 40 * time.Millisecond, 60 * time.Millisecond, idle(time.Second), false, false},
		{"young, sent before a lost probe, but it arrived (idle since)", 100 * time.Millisecond, 60 * time.Millisecond, idle(50 * time.Millisecond), false, false},
		{"sent before a lost probe, running", 100 * time.Millisecond, 60 * time.Millisecond, map[uint32]session{pid: {state: "active"}}, false, false},
		{"sent before a lost probe, session gone: the longer margin", 100 * time.Millisecond, 60 * time.Millisecond, map[uint32]session{}, false, false},
		{"session gone past the margin", stallMargin + 10*time.Millisecond, 0, map[uint32]session{}, true, false},
		{"answered, waiting for the client past the margin", stallMargin + 10*time.Millisecond, 0, idle(stallMargin + 5*time.Millisecond), true, false},
		{"answered, waiting for the client within the margin", stallMargin / 2, 0, idle(stallMargin / 4), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := probeResult{sent: sent, rtt: rtt, sessions: tc.sessions}
			if tc.lost > 0 {
				r.lost = sent.Add(-tc.lost)
			}
			st := &tracked{pid: pid, since: sent.Add(-tc.age)}
			dead, unsent := st.verdict(r, true)
			if dead != tc.dead || unsent != tc.unsent {
				t.Fatalf("dead %v, unsent %v; want %v, %v", dead, unsent, tc.dead, tc.unsent)
			}
		})
	}
}

// TestStallLostProbe: a probe counts as lost when a probe that started at least
// probeLost after it answered first; not when the later one failed too, or started too
// soon after it to tell a lost probe from a slow one.
func TestStallLostProbe(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	out := []time.Time{at(0), at(50), at(100)}
	for _, tc := range []struct {
		name string
		r    probeResult
		want time.Time
	}{
		{"the latest one early enough", probeResult{started: at(150)}, at(100)},
		{"too soon after the latest", probeResult{started: at(120)}, at(50)},
		{"it failed too", probeResult{started: at(150), err: errors.New("timeout")}, time.Time{}},
		{"none before it", probeResult{started: at(30)}, time.Time{}},
	} {
		if got := lostProbe(out, tc.r); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
