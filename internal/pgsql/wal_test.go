package pgsql

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

// The default names keep outboxes apart: a slot's name is unique in the whole server,
// a publication's in its database.
func TestWALDefaults(t *testing.T) {
	for _, tc := range []struct{ schema, prefix, slot, pub string }{
		{"", "", "outbox_wal", "outbox_pub"},
		{"public", "app_", "app_outbox_wal", "app_outbox_pub"},
		{"billing", "", "billing_outbox_wal", "billing_outbox_pub"},
		{"billing", "app_", "billing_app_outbox_wal", "billing_app_outbox_pub"},
	} {
		n, err := NewNames(Config{Schema: tc.schema, Prefix: tc.prefix})
		if err != nil {
			t.Fatal(err)
		}
		if slot, pub := n.WALDefaults(); slot != tc.slot || pub != tc.pub {
			t.Errorf("schema %q prefix %q: defaults %s, %s; want %s, %s", tc.schema, tc.prefix, slot, pub, tc.slot, tc.pub)
		}
	}
}

func TestCheckWALName(t *testing.T) {
	for _, ok := range []string{"outbox_wal", "_x", "a1", strings.Repeat("s", 63)} {
		if err := CheckWALName("Slot", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Outbox", "1a", "a-b", "a b", `x"; DROP TABLE y; --`, "x'y", strings.Repeat("s", 64)} {
		err := CheckWALName("Publication", bad)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Publication" {
			t.Errorf("%q: %v; want a ConfigError naming Publication", bad, err)
		}
	}
}

// An existing publication is used only when it is exactly what setup would create.
func TestPubMismatch(t *testing.T) {
	n, err := NewNames(Config{Schema: "s", Prefix: "p_"})
	if err != nil {
		t.Fatal(err)
	}
	fits := walPubFacts{exists: true, owned: true, ins: true, viaRoot: true, tables: "s.p_outbox"}
	for _, tc := range []struct {
		name string
		edit func(*walPubFacts)
		want string // in the mismatch; "" for none
	}{
		{"fits", func(*walPubFacts) {}, ""},
		{"all tables", func(p *walPubFacts) { p.allTables = true }, "FOR ALL TABLES"},
		{"another table too", func(p *walPubFacts) { p.tables = "s.other, s.p_outbox" }, "publishes s.other, s.p_outbox, not only s.p_outbox"},
		{"no table", func(p *walPubFacts) { p.tables = "" }, "publishes no table"},
		{"leaves", func(p *walPubFacts) { p.tables = "s.p_outbox_b0, s.p_outbox_b1"; p.viaRoot = false }, "publish_via_partition_root is false"},
		{"updates", func(p *walPubFacts) { p.upd, p.del = true, true }, `publishes "insert, update, delete"`},
		{"no inserts", func(p *walPubFacts) { p.ins, p.trunc = false, true }, `publishes "truncate"`},
		{"row filter", func(p *walPubFacts) { p.filtered = true }, "row filter"},
	} {
		p := fits
		tc.edit(&p)
		got := n.pubMismatch(p)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: mismatch %q; want one with %q", tc.name, got, tc.want)
		}
	}
}

func TestWALCheckErrorMessage(t *testing.T) {
	one := &WALCheckError{Problems: []string{"wal_level is \"replica\""}}
	if one.Error() != `wal_level is "replica"` {
		t.Errorf("one problem: %q", one.Error())
	}
	two := &WALCheckError{Problems: []string{"a", "b"}}
	if got := two.Error(); got != "2 problems, nothing was changed:\n  - a\n  - b" {
		t.Errorf("two problems: %q", got)
	}
}

func TestPgDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{30 * time.Second: "30s", 1500 * time.Millisecond: "1500ms", time.Minute: "60s"} {
		if got := pgDuration(d); got != want {
			t.Errorf("%s: %s, want %s", d, got, want)
		}
	}
}

// A dry run shows the statements that would run, with the configured names quoted, and
// each multi-statement step as one transaction.
func TestWALStepsRender(t *testing.T) {
	n, err := NewNames(Config{Schema: "s", Prefix: "p_"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := n.createPublicationSQL("p_pub"), `CREATE PUBLICATION "p_pub" FOR TABLE "s"."p_outbox" WITH (publish = 'insert', publish_via_partition_root = true)`; got != want {
		t.Errorf("publication:\n%s\nwant\n%s", got, want)
	}
	slot := n.createSlotStep(nil, WALSetupOptions{Slot: "s_p_wal"}, 30*time.Second)
	if want := "BEGIN;\nSET LOCAL statement_timeout = '30s';\nSELECT lsn::text FROM pg_create_logical_replication_slot('s_p_wal', 'pgoutput');\nCOMMIT;"; slot.SQL != want {
		t.Errorf("slot step:\n%s\nwant\n%s", slot.SQL, want)
	}
	trig := n.triggerStep(nil, "s_p_wal", false)
	for _, want := range []string{`ALTER TABLE "s"."p_outbox" DISABLE TRIGGER "p_outbox_notify"`, `UPDATE "s"."p_outbox_wal" SET notify_disabled = true WHERE slot_name = 's_p_wal'`} {
		if !strings.Contains(trig.SQL, want) {
			t.Errorf("trigger step lacks %s:\n%s", want, trig.SQL)
		}
	}
	if rec := n.recordSlotSQL("s_p_wal", "p_pub"); !strings.Contains(rec, `pg_get_serial_sequence('"s"."p_outbox"', 'seq')`) || !strings.Contains(rec, `INSERT INTO "s"."p_outbox_wal"`) {
		t.Errorf("record:\n%s", rec)
	}
}
