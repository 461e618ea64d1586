// Package deploy_test checks the files in deploy/ against the things they describe: the
// alert rules with promtool (syntax and unit tests), their runbooks in docs/operations.md,
// the Grafana dashboard's queries against the metrics outboxprom exports, and the systemd
// unit and Kubernetes manifests against the flags and environment variables of the
// outbox binary built from ../cmd/outbox.
package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

var update = flag.Bool("update", false, "rewrite kubernetes/prometheus-rule.yaml from prometheus/outbox-alerts.yml")

const (
	rulesFile     = "prometheus/outbox-alerts.yml"
	rulesTestFile = "prometheus/outbox-alerts_test.yml"
	promConfig    = "prometheus/prometheus.yml"
	dashboardFile = "grafana/outbox-dashboard.json"
	unitFile      = "systemd/outbox-relay.service"
	envExample    = "systemd/relay.env.example"
	k8sDir        = "kubernetes"
	promRuleFile  = "kubernetes/prometheus-rule.yaml"
	operationsDoc = "../docs/operations.md"
	metricsDoc    = "../outboxprom/doc.go"

	runbookBase    = "https://github.com/outboxkit/outbox/blob/main/docs/operations.md#"
	runbookSection = "Alerts and runbooks"
)

// knownMetrics are the metric names the deploy files may use: those of the observability
// issue's list, which outboxprom exports (its doc.go lists them with their labels).
// Histograms also answer to _bucket, _sum and _count.
var knownMetrics = map[string]bool{
	"outbox_relay_up":                            false,
	"outbox_published_total":                     false,
	"outbox_publish_failed_total":                false,
	"outbox_retried_total":                       false,
	"outbox_dead_lettered_total":                 false,
	"outbox_publish_latency_seconds":             true,
	"outbox_commit_latency_seconds":              true,
	"outbox_last_publish_timestamp_seconds":      false,
	"outbox_publish_batch_size":                  true,
	"outbox_fetch_batch_size":                    true,
	"outbox_fetch_duration_seconds":              true,
	"outbox_record_duration_seconds":             true,
	"outbox_fetch_errors_total":                  false,
	"outbox_record_errors_total":                 false,
	"outbox_shards_held":                         false,
	"outbox_shards_gained_total":                 false,
	"outbox_shards_lost_total":                   false,
	"outbox_outcomes_refused_total":              false,
	"outbox_broker_pauses_total":                 false,
	"outbox_status_up":                           false,
	"outbox_pending":                             false,
	"outbox_due":                                 false,
	"outbox_retrying":                            false,
	"outbox_dead":                                false,
	"outbox_oldest_pending_age_seconds":          false,
	"outbox_priority_pending":                    false,
	"outbox_priority_oldest_pending_age_seconds": false,
	"outbox_relays_live":                         false,
	"outbox_destination_up":                      false,
	"outbox_destination_published_total":         false,
	"outbox_destination_failed_total":            false,
	"outbox_destination_deferred_total":          false,
	"outbox_relay_routings":                      false,
	"outbox_shards":                              false,
	"outbox_shards_leased":                       false,
	"outbox_partitions":                          false,
	"outbox_partition_days_ahead":                false,
	"outbox_oldest_transaction_age_seconds":      false,
	"outbox_ring_rotations":                      false,
	"outbox_ring_rows_since_rotation":            false,
	"outbox_wal_source":                          false,
	"outbox_wal_slot_exists":                     false,
	"outbox_wal_slot_active":                     false,
	"outbox_wal_slot_status":                     false,
	"outbox_wal_slot_lag_bytes":                  false,
	"outbox_wal_slot_retained_bytes":             false,
	"outbox_wal_slot_safe_wal_size_bytes":        false,
	"outbox_wal_reading":                         false,
	"outbox_wal_heartbeat_timestamp_seconds":     false,
	"outbox_wal_silent_reopens_total":            false,
	"outbox_wal_slot_recreations_total":          false,
	"outbox_wal_log_messages_total":              false,
}

// baseMetric returns the metric a series name belongs to, and whether it is known.
func baseMetric(name string) (string, bool) {
	if _, ok := knownMetrics[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && knownMetrics[base] {
			return base, true
		}
	}
	return name, false
}

// ---- promtool ----

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed; it checks and unit-tests the alert rules in deploy/prometheus. " +
			"Install the Debian package prometheus (apt-get install prometheus), as scripts/test.sh does.")
	}
	return p
}

// runIn runs a command in dir and returns its combined output, failing the test with
// that output when it exits non-zero.
func runIn(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	p := promtool(t)
	runIn(t, ".", p, "check", "rules", rulesFile)
	runIn(t, filepath.Dir(rulesTestFile), p, "test", "rules", filepath.Base(rulesTestFile))
}

func TestPrometheusConfigPassesPromtool(t *testing.T) {
	t.Parallel()
	runIn(t, ".", promtool(t), "check", "config", promConfig)
}

// ---- the alert rules ----

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func alertRules(t *testing.T) []rule {
	t.Helper()
	var rg ruleGroups
	readYAML(t, rulesFile, &rg)
	var alerts []rule
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r)
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatalf("%s: no alert rules", rulesFile)
	}
	return alerts
}

// TestAlertRulesHaveRunbooks checks that every alert carries a severity, a summary, a
// description and a runbook_url, and that the runbook exists: a heading named after the
// alert in the "Alerts and runbooks" section of docs/operations.md, which holds no
// runbook of an alert that is gone.
func TestAlertRulesHaveRunbooks(t *testing.T) {
	t.Parallel()
	runbooks := runbookHeadings(t)
	alerts := map[string]bool{}
	for _, r := range alertRules(t) {
		alerts[r.Alert] = true
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("alert %s: no %s annotation", r.Alert, a)
			}
		}
		want := runbookBase + strings.ToLower(r.Alert)
		if got := r.Annotations["runbook_url"]; got != want {
			t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, got, want)
		}
		if !runbooks[githubAnchor(r.Alert)] {
			t.Errorf("alert %s has no runbook: add a heading %q under %q in %s", r.Alert, "### "+r.Alert, "## "+runbookSection, operationsDoc)
		}
	}
	for anchor, name := range runbookNames(t) {
		if !alerts[name] {
			t.Errorf("%s: runbook %q (#%s) is for no alert of %s", operationsDoc, name, anchor, rulesFile)
		}
	}
}

// runbookNames returns the "### " headings of the runbook section that look like alert
// names (Outbox...), by anchor.
func runbookNames(t *testing.T) map[string]string {
	t.Helper()
	names := map[string]string{}
	for _, h := range sectionHeadings(t) {
		if strings.HasPrefix(h, "Outbox") && !strings.Contains(h, " ") {
			names[githubAnchor(h)] = h
		}
	}
	return names
}

func runbookHeadings(t *testing.T) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	for _, h := range sectionHeadings(t) {
		anchors[githubAnchor(h)] = true
	}
	return anchors
}

// sectionHeadings returns the "### " headings inside the "## Alerts and runbooks"
// section of docs/operations.md.
func sectionHeadings(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	var headings []string
	in, found, fence := false, false, false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence {
			continue
		}
		if h, ok := strings.CutPrefix(line, "## "); ok {
			in = strings.TrimSpace(h) == runbookSection
			found = found || in
		}
		if h, ok := strings.CutPrefix(line, "### "); ok && in {
			headings = append(headings, strings.TrimSpace(h))
		}
	}
	if !found {
		t.Fatalf("%s has no section %q", operationsDoc, "## "+runbookSection)
	}
	return headings
}

// githubAnchor is the fragment GitHub gives a Markdown heading: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestAlertRulesAreUnitTested checks that the promtool tests cover every alert both ways:
// at least one evaluation where it must fire and one where it must not.
func TestAlertRulesAreUnitTested(t *testing.T) {
	t.Parallel()
	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				AlertName string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, rulesTestFile, &tests)
	if !slices.Contains(tests.RuleFiles, filepath.Base(rulesFile)) {
		t.Errorf("%s: rule_files %v does not name %s", rulesTestFile, tests.RuleFiles, filepath.Base(rulesFile))
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, at := range tc.AlertRuleTest {
			if len(at.ExpAlerts) > 0 {
				fires[at.AlertName] = true
			} else {
				silent[at.AlertName] = true
			}
		}
	}
	for _, r := range alertRules(t) {
		if !fires[r.Alert] {
			t.Errorf("%s: no test where %s must fire", rulesTestFile, r.Alert)
		}
		if !silent[r.Alert] {
			t.Errorf("%s: no test where %s must not fire", rulesTestFile, r.Alert)
		}
	}
}

// ---- metric names in PromQL ----

var (
	promqlStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlBraces   = regexp.MustCompile(`\{[^{}]*\}`)
	promqlBrackets = regexp.MustCompile(`\[[^\[\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	grafanaVars    = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	promqlToken    = regexp.MustCompile(`[A-Za-z0-9_.:]+`)
	promqlKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"inf": true, "nan": true, "Inf": true, "NaN": true, "atan2": true,
	}
)

// metricNamesOf returns the metric names a PromQL expression selects, in order. It is no
// parser, but PromQL makes this easy: a name is an identifier that is not a keyword and
// not followed by "(" (a function or aggregation) once strings, label matchers, ranges
// and grouping lists are cut out.
func metricNamesOf(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = grafanaVars.ReplaceAllString(s, "")
	s = promqlBraces.ReplaceAllString(s, " ")
	s = promqlBrackets.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promqlToken.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if c := tok[0]; c >= '0' && c <= '9' || c == '.' || promqlKeywords[tok] {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue
		}
		names = append(names, tok)
	}
	return names
}

func TestMetricNamesOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (namespace, job) (max by (namespace, job, topic) (outbox_pending)) > 1000`, []string{"outbox_pending"}},
		{`histogram_quantile(0.99, sum by (topic, le) (rate(outbox_publish_latency_seconds_bucket{job="$job", topic=~"a|b(c)"}[$__rate_interval])))`,
			[]string{"outbox_publish_latency_seconds_bucket"}},
		{`time() - max(outbox_last_publish_timestamp_seconds offset 5m) and on () absent(up == 1)`,
			[]string{"outbox_last_publish_timestamp_seconds", "up"}},
		{`rate(outbox_bogus_total[5m]) / ignoring(reason) group_left sum(rate(x:y[1m])) by (topic) > 1e3`,
			[]string{"outbox_bogus_total", "x:y"}},
		{`delta(sum(outbox_pending)[5m:1m]) > 0 or vector(0)`, []string{"outbox_pending"}},
	} {
		if got := metricNamesOf(tc.expr); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("metricNamesOf(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// checkMetricNames reports names not in knownMetrics, and names outboxprom's doc.go does
// not mention (the deploy files and the exporter disagree).
func checkMetricNames(t *testing.T, where string, names []string) {
	t.Helper()
	doc, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatalf("the metrics' documentation: %v", err)
	}
	for _, n := range names {
		base, ok := baseMetric(n)
		if !ok {
			t.Errorf("%s: metric %s is not one outbox exports", where, n)
			continue
		}
		if !regexp.MustCompile(`\b` + base + `\b`).Match(doc) {
			t.Errorf("%s: metric %s is not in %s", where, base, metricsDoc)
		}
	}
}

func TestAlertRulesUseKnownMetrics(t *testing.T) {
	t.Parallel()
	for _, r := range alertRules(t) {
		names := metricNamesOf(r.Expr)
		if len(names) == 0 {
			t.Errorf("alert %s: no metric in its expression", r.Alert)
		}
		checkMetricNames(t, "alert "+r.Alert, names)
	}
}

// ---- the Grafana dashboard ----

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) (dashboard, []panel) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	var all []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return d, all
}

// TestDashboard checks the dashboard's structure (ids, layout, data source variable), and
// that it shows what operators need, with metrics outbox exports.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d, panels := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard: uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if q, ok := v.Query.(map[string]any); ok && v.Type == "query" {
			query, _ := q["query"].(string)
			m := regexp.MustCompile(`^label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)`).FindStringSubmatch(query)
			if m == nil {
				t.Errorf("variable %s: query %q: want label_values(metric..., label)", v.Name, query)
				continue
			}
			checkMetricNames(t, "variable "+v.Name, m[1:])
		}
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("dashboard: no datasource variable: panels should use ${datasource}, so that the dashboard imports into any Grafana")
	}

	ids := map[int]string{}
	used := map[string]bool{}
	type rect struct {
		title      string
		x, y, w, h int
	}
	var rects []rect
	for _, p := range panels {
		if other, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d is zero or also %q's", p.Title, p.ID, other)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for _, r := range rects {
			if g.X < r.x+r.w && r.x < g.X+g.W && g.Y < r.y+r.h && r.y < g.Y+g.H {
				t.Errorf("panel %q overlaps panel %q", p.Title, r.title)
			}
		}
		rects = append(rects, rect{p.Title, g.X, g.Y, g.W, g.H})
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no queries", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q, query %s: empty", p.Title, tg.RefID)
				continue
			}
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q, query %s: data source %q, want ${datasource}", p.Title, tg.RefID, tg.Datasource.UID)
			}
			names := metricNamesOf(tg.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q, query %s: no metric in %q", p.Title, tg.RefID, tg.Expr)
			}
			checkMetricNames(t, fmt.Sprintf("panel %q", p.Title), names)
			for _, n := range names {
				base, _ := baseMetric(n)
				used[base] = true
			}
		}
	}
	// What the dashboard is for: throughput, latency quantiles, backlog per topic, leases
	// and relays.
	for _, m := range []string{
		"outbox_published_total", "outbox_publish_failed_total",
		"outbox_publish_latency_seconds", "outbox_commit_latency_seconds",
		"outbox_pending", "outbox_due", "outbox_retrying", "outbox_dead", "outbox_oldest_pending_age_seconds",
		"outbox_shards_held", "outbox_shards_gained_total", "outbox_outcomes_refused_total", "outbox_relay_up",
	} {
		if !used[m] {
			t.Errorf("dashboard: no panel shows %s", m)
		}
	}
}

// TestDashboardQueriesParse has promtool parse every dashboard query, as recording rules
// of a throw-away rule file, with Grafana's variables replaced by plain values.
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	p := promtool(t)
	_, panels := readDashboard(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, pn := range panels {
		for _, tg := range pn.Targets {
			expr := grafanaVars.ReplaceAllStringFunc(tg.Expr, func(v string) string {
				if strings.Contains(v, "__") {
					return "5m" // $__rate_interval, $__interval, $__range
				}
				return "x"
			})
			quoted, _ := json.Marshal(expr) // a JSON string is a YAML string
			fmt.Fprintf(&b, "      - record: dashboard_panel_%d_%s\n        expr: %s\n", pn.ID, tg.RefID, quoted)
			n++
		}
	}
	if n == 0 {
		t.Fatal("dashboard: no queries")
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runIn(t, ".", p, "check", "rules", path)
}

// ---- the outbox binary's flags ----

// cliFlags are the flags of one outbox command, from its --help.
type cliFlags struct {
	command  string
	defaults map[string]string // flag -> default ("" when none is printed)
	envs     map[string]string // OUTBOX_... -> flag
}

func (c cliFlags) hasFlag(name string) bool { _, ok := c.defaults[name]; return ok }

// envName is the environment variable of a flag, as `outbox help` explains it.
func envName(flagName string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// buildOutbox builds ../cmd/outbox into dir.
func buildOutbox(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "outbox")
	runIn(t, "..", "go", "build", "-o", bin, "./cmd/outbox")
	return bin
}

var (
	helpFlagLine = regexp.MustCompile(`^  --([a-z0-9][a-z0-9-]*)`)
	helpEnvLine  = regexp.MustCompile(`^\s+\((?:default (.*); )?env (OUTBOX_[A-Z0-9_]+)\)$`)
)

// helpFlags runs `outbox <command...> --help` and reads its flags.
func helpFlags(t *testing.T, bin string, command ...string) cliFlags {
	t.Helper()
	out := runIn(t, ".", bin, append(slices.Clone(command), "--help")...)
	c := cliFlags{command: strings.Join(command, " "), defaults: map[string]string{}, envs: map[string]string{}}
	current := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			current = m[1]
			c.defaults[current] = ""
			continue
		}
		if m := helpEnvLine.FindStringSubmatch(line); m != nil && current != "" {
			c.defaults[current] = m[1]
			c.envs[m[2]] = current
			if m[2] != envName(current) {
				t.Errorf("outbox %s --help: --%s reads %s, want %s", c.command, current, m[2], envName(current))
			}
			current = ""
		}
	}
	if len(c.defaults) == 0 {
		t.Fatalf("outbox %s --help lists no flags:\n%s", c.command, out)
	}
	for f := range c.defaults {
		if _, ok := c.envs[envName(f)]; !ok {
			t.Errorf("outbox %s --help: --%s shows no environment variable", c.command, f)
		}
	}
	return c
}

// setting is the value a deployment gives a flag: on the command line, else in the
// environment, else the default.
func setting(c cliFlags, name string, args []string, env map[string]string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	if v, ok := env[envName(name)]; ok {
		return v, true
	}
	d := c.defaults[name]
	return d, d != ""
}

// checkArgs checks the command words and flags of an outbox command line (without the
// binary) against the flags of want.
func checkArgs(t *testing.T, where string, args []string, c cliFlags) {
	t.Helper()
	words := strings.Fields(c.command)
	if len(args) < len(words) || !slices.Equal(args[:len(words)], words) {
		t.Errorf("%s: runs outbox %q, want outbox %s", where, args, c.command)
		return
	}
	for _, a := range args[len(words):] {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !c.hasFlag(name) {
			t.Errorf("%s: outbox %s has no flag --%s", where, c.command, name)
		}
	}
}

// secretVar tells the variables that may hold secrets: they belong in the root-only
// environment file or a Secret, never in a unit or a ConfigMap.
func secretVar(name string) bool {
	return name == "OUTBOX_DATABASE_URL" || name == "OUTBOX_BROKER" ||
		strings.HasSuffix(name, "_PASSWORD") || strings.HasSuffix(name, "_SECRET") || strings.HasSuffix(name, "_TOKEN")
}

// placeholderSecret is the only password the example files may hold.
const placeholderSecret = "CHANGE_ME"

var (
	urlPassword = regexp.MustCompile(`://[^\s:/@"']+:([^\s@"']+)@`)
	envAnywhere = regexp.MustCompile(`\bOUTBOX_[A-Z0-9_]+`)
	envAssign   = regexp.MustCompile(`^#?\s*(OUTBOX_[A-Z0-9_]+)=(.*)$`)
)

// checkNoRealSecrets fails on a password in a URL, or a value of a secret variable, that
// is not the placeholder.
func checkNoRealSecrets(t *testing.T, path, text string) {
	t.Helper()
	for _, m := range urlPassword.FindAllStringSubmatch(text, -1) {
		if m[1] != placeholderSecret {
			t.Errorf("%s: URL with password %q: example files hold only %s", path, m[1], placeholderSecret)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if m := envAssign.FindStringSubmatch(strings.TrimSpace(line)); m != nil && secretVar(m[1]) &&
			!strings.Contains(m[2], "://") && strings.Trim(m[2], `"`) != placeholderSecret {
			t.Errorf("%s: %s=%s: example files hold only %s", path, m[1], m[2], placeholderSecret)
		}
	}
}

// metricsPort returns the port of a --metrics-addr value.
func metricsPort(t *testing.T, where, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	port, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("%s: --metrics-addr %q: want host:port or :port", where, addr)
	}
	return port
}

// parseDuration reads the relay's durations (30s, 1m) and systemd's (45, 45s, 1min 30s).
func parseDuration(t *testing.T, where, s string) time.Duration {
	t.Helper()
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second
	}
	norm := strings.NewReplacer(" ", "", "min", "m", "sec", "s").Replace(s)
	d, err := time.ParseDuration(norm)
	if err != nil {
		t.Fatalf("%s: %q is not a duration", where, s)
	}
	return d
}

// TestDeployFilesMatchTheCLI builds the outbox binary and checks the systemd unit and the
// Kubernetes manifests against its --help: every command, flag and OUTBOX_ variable they
// use exists, the stop timeout exceeds --shutdown-grace, and the probes and scrapes hit
// /healthz, /readyz and /metrics on the --metrics-addr port.
func TestDeployFilesMatchTheCLI(t *testing.T) {
	t.Parallel()
	bin := buildOutbox(t, t.TempDir())
	relay := helpFlags(t, bin, "relay")
	migrate := helpFlags(t, bin, "migrate", "up")
	for _, f := range []string{"metrics-addr", "shutdown-grace", "database-url", "broker"} {
		if !relay.hasFlag(f) {
			t.Fatalf("outbox relay --help lists no --%s, which the deploy files rely on", f)
		}
	}

	t.Run("variables", func(t *testing.T) {
		// Every OUTBOX_ variable named anywhere (comments included) is one of the relay's
		// or of outbox migrate up.
		files, _ := filepath.Glob("systemd/*")
		k8s, _ := filepath.Glob(k8sDir + "/*")
		files = append(append(files, k8s...), "README.md")
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range envAnywhere.FindAllString(string(raw), -1) {
				if _, ok := relay.envs[v]; !ok {
					if _, ok := migrate.envs[v]; !ok {
						t.Errorf("%s: %s is not a variable of outbox relay or outbox migrate up", f, v)
					}
				}
			}
			if f != "README.md" {
				checkNoRealSecrets(t, f, string(raw))
			}
		}
	})
	t.Run("systemd", func(t *testing.T) { checkSystemd(t, bin, relay) })
	t.Run("kubernetes", func(t *testing.T) { checkKubernetes(t, relay, migrate) })
}

// ---- systemd ----

type unitEntry struct{ section, key, value string }

// parseUnit reads a systemd unit: sections, keys (repeated ones kept in order),
// continuation lines. Commented ExecStart= lines are returned as key "#ExecStart", so
// that the examples in comments are checked too.
func parseUnit(raw string) []unitEntry {
	var entries []unitEntry
	section, pending := "", ""
	for _, line := range strings.Split(raw, "\n") {
		line = strings.TrimSpace(line)
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		switch {
		case strings.HasPrefix(line, "#ExecStart="):
			entries = append(entries, unitEntry{section, "#ExecStart", strings.TrimPrefix(line, "#ExecStart=")})
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			entries = append(entries, unitEntry{section, strings.TrimSpace(k), strings.TrimSpace(v)})
		}
	}
	return entries
}

// unitValues returns the values of section.key, after the last empty one (which resets a
// list in systemd).
func unitValues(entries []unitEntry, section, key string) []string {
	var vs []string
	for _, e := range entries {
		if e.section == section && e.key == key {
			if e.value == "" {
				vs = nil
				continue
			}
			vs = append(vs, e.value)
		}
	}
	return vs
}

func unitValue(entries []unitEntry, section, key string) string {
	vs := unitValues(entries, section, key)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// splitAssignments splits an Environment= value: space-separated KEY=VALUE words, each
// possibly in double quotes.
func splitAssignments(s string) []string {
	var words []string
	var b strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ' ' && !quoted:
			if b.Len() > 0 {
				words = append(words, b.String())
				b.Reset()
			}
		default:
			b.WriteRune(r)
		}
	}
	if b.Len() > 0 {
		words = append(words, b.String())
	}
	return words
}

func checkSystemd(t *testing.T, bin string, relay cliFlags) {
	raw, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	entries := parseUnit(string(raw))

	execs := unitValues(entries, "Service", "ExecStart")
	if len(execs) != 1 {
		t.Fatalf("%s: ExecStart %q: want one command", unitFile, execs)
	}
	args := strings.Fields(execs[0])
	if filepath.Base(args[0]) != "outbox" || !filepath.IsAbs(args[0]) {
		t.Errorf("%s: ExecStart runs %s, want an absolute path to outbox", unitFile, args[0])
	}
	checkArgs(t, unitFile+": ExecStart", args[1:], relay)
	for _, e := range unitValues(entries, "Service", "#ExecStart") {
		if a := strings.Fields(e); len(a) > 1 {
			checkArgs(t, unitFile+": ExecStart in a comment", a[1:], relay)
		}
	}

	env := map[string]string{}
	for _, v := range unitValues(entries, "Service", "Environment") {
		for _, kv := range splitAssignments(v) {
			k, val, _ := strings.Cut(kv, "=")
			env[k] = val
			if _, ok := relay.envs[k]; strings.HasPrefix(k, "OUTBOX_") && !ok {
				t.Errorf("%s: Environment=%s: outbox relay reads no %s", unitFile, kv, k)
			}
			if secretVar(k) {
				t.Errorf("%s: Environment=%s: secrets belong in the root-only EnvironmentFile, not in the unit (systemctl show prints it)", unitFile, k)
			}
		}
	}

	// The secrets: a root-only environment file, whose example is in deploy/systemd.
	envFiles := unitValues(entries, "Service", "EnvironmentFile")
	if len(envFiles) != 1 || !strings.HasPrefix(strings.TrimPrefix(envFiles[0], "-"), "/etc/") {
		t.Errorf("%s: EnvironmentFile %q: want one file under /etc", unitFile, envFiles)
	}
	example, err := os.ReadFile(envExample)
	if err != nil {
		t.Fatal(err)
	}
	if len(envFiles) == 1 && !strings.Contains(string(example), strings.TrimPrefix(envFiles[0], "-")) {
		t.Errorf("%s does not say it is installed as %s", envExample, envFiles[0])
	}
	exampleVars := map[string]bool{}
	for _, line := range strings.Split(string(example), "\n") {
		m := envAssign.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		if _, ok := relay.envs[m[1]]; !ok {
			t.Errorf("%s: outbox relay reads no %s", envExample, m[1])
		}
		if !strings.HasPrefix(line, "#") {
			exampleVars[m[1]] = true
			env[m[1]] = m[2]
		}
	}
	if !exampleVars["OUTBOX_DATABASE_URL"] {
		t.Errorf("%s: no OUTBOX_DATABASE_URL", envExample)
	}

	// Stopping: SIGTERM, and more time than --shutdown-grace before SIGKILL.
	if s := unitValue(entries, "Service", "KillSignal"); s != "" && s != "SIGTERM" {
		t.Errorf("%s: KillSignal=%s: the relay drains on SIGTERM", unitFile, s)
	}
	grace, _ := setting(relay, "shutdown-grace", args[2:], env)
	stop := unitValue(entries, "Service", "TimeoutStopSec")
	if stop == "" {
		t.Errorf("%s: no TimeoutStopSec: systemd's default (90s) should be set explicitly above --shutdown-grace", unitFile)
	} else if s, g := parseDuration(t, unitFile, stop), parseDuration(t, "--shutdown-grace", grace); s <= g {
		t.Errorf("%s: TimeoutStopSec=%s is not above --shutdown-grace %s: systemd would kill the relay while it drains", unitFile, stop, grace)
	}
	if r := unitValue(entries, "Service", "Restart"); r != "on-failure" {
		t.Errorf("%s: Restart=%s, want on-failure", unitFile, r)
	}

	// Hardening.
	if unitValue(entries, "Service", "DynamicUser") != "yes" {
		if u := unitValue(entries, "Service", "User"); u == "" || u == "root" || u == "0" {
			t.Errorf("%s: runs as root: want DynamicUser=yes or a dedicated User=", unitFile)
		}
	}
	for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes"} {
		if got := unitValue(entries, "Service", k); got != want {
			t.Errorf("%s: %s=%q, want %s", unitFile, k, got, want)
		}
	}

	// Metrics on the port the example Prometheus configuration scrapes.
	addr, ok := setting(relay, "metrics-addr", args[2:], env)
	if !ok || addr == "" {
		t.Errorf("%s: no --metrics-addr (OUTBOX_METRICS_ADDR): nothing to scrape", unitFile)
	} else {
		port := metricsPort(t, unitFile, addr)
		var cfg struct {
			ScrapeConfigs []struct {
				JobName       string `yaml:"job_name"`
				MetricsPath   string `yaml:"metrics_path"`
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"scrape_configs"`
		}
		readYAML(t, promConfig, &cfg)
		targets := 0
		for _, sc := range cfg.ScrapeConfigs {
			if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
				t.Errorf("%s: job %s scrapes %s, the relay serves /metrics", promConfig, sc.JobName, sc.MetricsPath)
			}
			for _, st := range sc.StaticConfigs {
				for _, tg := range st.Targets {
					targets++
					if _, p, _ := net.SplitHostPort(tg); p != strconv.Itoa(port) {
						t.Errorf("%s: target %s: the unit's relay listens on port %d", promConfig, tg, port)
					}
				}
			}
		}
		if targets == 0 {
			t.Errorf("%s: no scrape targets", promConfig)
		}
	}

	// systemd's own check of the unit (unknown keys, bad values), with ExecStart pointing
	// at the binary just built so that it exists.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is not installed; it checks deploy/systemd/outbox-relay.service. Install the Debian package systemd (apt-get install systemd).")
	}
	dir := t.TempDir()
	copyPath := filepath.Join(dir, filepath.Base(unitFile))
	unit := strings.Replace(string(raw), "ExecStart="+args[0], "ExecStart="+bin, 1)
	if err := os.WriteFile(copyPath, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", copyPath)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=notice")
	out, err := cmd.CombinedOutput()
	var complaints []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, filepath.Base(unitFile)) {
			complaints = append(complaints, line)
		}
	}
	if err != nil || len(complaints) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitFile, err, strings.Join(complaints, "\n"))
	}
}

// ---- Kubernetes ----

// intOrString is a Kubernetes IntOrString: a port number or a port name.
type intOrString string

func (s *intOrString) UnmarshalYAML(n *yaml.Node) error {
	*s = intOrString(n.Value)
	return nil
}

type probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *probe `yaml:"startupProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext securityContext `yaml:"securityContext"`
}

type podTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int            `yaml:"terminationGracePeriodSeconds"`
		AutomountServiceAccountToken  *bool           `yaml:"automountServiceAccountToken"`
		EnableServiceLinks            *bool           `yaml:"enableServiceLinks"`
		SecurityContext               securityContext `yaml:"securityContext"`
		Containers                    []container     `yaml:"containers"`
	} `yaml:"spec"`
}

type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Resources  []string          `yaml:"resources"` // a Kustomization's
	Spec       struct {
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template podTemplate `yaml:"template"`
		// A Service's
		ServiceSelector          map[string]string `yaml:"-"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Ports                    []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		} `yaml:"ports"`
		// A ServiceMonitor's
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
		// A PrometheusRule's
		Groups []any `yaml:"groups"`
	} `yaml:"spec"`
}

func readK8s(t *testing.T) []*k8sObject {
	t.Helper()
	files, err := filepath.Glob(k8sDir + "/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", k8sDir, err)
	}
	var objs []*k8sObject
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var n yaml.Node
			if err := dec.Decode(&n); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			o := &k8sObject{file: f}
			if err := n.Decode(o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "Service" {
				var svc struct {
					Spec struct {
						Selector map[string]string `yaml:"selector"`
					} `yaml:"spec"`
				}
				if err := n.Decode(&svc); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				o.Spec.ServiceSelector = svc.Spec.Selector
			}
			if o.Kind == "" || o.APIVersion == "" {
				t.Errorf("%s: a document without apiVersion or kind", f)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func find(objs []*k8sObject, kind, name string) *k8sObject {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	return nil
}

func ofKind(objs []*k8sObject, kind string) []*k8sObject {
	var out []*k8sObject
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// subset reports whether every label of sel is in labels (and sel is not empty).
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerCommand returns the outbox command line of c without the binary.
func containerCommand(c container) []string {
	args := append(slices.Clone(c.Command), c.Args...)
	if len(args) > 0 && filepath.Base(args[0]) == "outbox" {
		args = args[1:]
	}
	return args
}

func checkKubernetes(t *testing.T, relay, migrate cliFlags) {
	objs := readK8s(t)
	commands := map[string]cliFlags{relay.command: relay, migrate.command: migrate}

	// Which command each container runs, and the variables it gets.
	type podOwner struct {
		obj  *k8sObject
		c    container
		cmd  cliFlags
		args []string
		env  map[string]string
	}
	var owners []podOwner
	loaders := map[string][]cliFlags{} // ConfigMap or Secret -> commands of the containers that load it
	for _, o := range objs {
		if o.Kind != "Deployment" && o.Kind != "Job" {
			continue
		}
		spec := o.Spec.Template.Spec
		where := o.file + ": " + o.Kind + " " + o.Metadata.Name
		if len(spec.Containers) == 0 {
			t.Errorf("%s: no containers", where)
		}
		for _, c := range spec.Containers {
			args := containerCommand(c)
			var cmd cliFlags
			found := false
			for name, cf := range commands {
				words := strings.Fields(name)
				if len(args) >= len(words) && slices.Equal(args[:len(words)], words) {
					cmd, found = cf, true
				}
			}
			if !found {
				t.Errorf("%s: container %s runs outbox %q: want relay or migrate up", where, c.Name, args)
				continue
			}
			checkArgs(t, where+": container "+c.Name, args, cmd)
			env := map[string]string{}
			for _, ef := range c.EnvFrom {
				var src *k8sObject
				switch {
				case ef.ConfigMapRef != nil:
					src = find(objs, "ConfigMap", ef.ConfigMapRef.Name)
					loaders["ConfigMap/"+ef.ConfigMapRef.Name] = append(loaders["ConfigMap/"+ef.ConfigMapRef.Name], cmd)
					if src == nil {
						t.Errorf("%s: envFrom ConfigMap %s: no such ConfigMap in %s", where, ef.ConfigMapRef.Name, k8sDir)
					}
				case ef.SecretRef != nil:
					src = find(objs, "Secret", ef.SecretRef.Name)
					loaders["Secret/"+ef.SecretRef.Name] = append(loaders["Secret/"+ef.SecretRef.Name], cmd)
					if src == nil {
						t.Errorf("%s: envFrom Secret %s: no example of it in %s", where, ef.SecretRef.Name, k8sDir)
					}
				}
				if src != nil {
					for k, v := range src.Data {
						env[k] = v
					}
					for k, v := range src.StringData {
						env[k] = v
					}
				}
			}
			for _, e := range c.Env {
				if _, ok := cmd.envs[e.Name]; strings.HasPrefix(e.Name, "OUTBOX_") && !ok {
					t.Errorf("%s: env %s: outbox %s reads no such variable", where, e.Name, cmd.command)
				}
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					ref := e.ValueFrom.SecretKeyRef
					if s := find(objs, "Secret", ref.Name); s == nil {
						t.Errorf("%s: env %s from Secret %s: no example of it in %s", where, e.Name, ref.Name, k8sDir)
					} else if _, ok := s.StringData[ref.Key]; !ok {
						t.Errorf("%s: env %s from Secret %s: the example has no key %s", where, e.Name, ref.Name, ref.Key)
					}
					env[e.Name] = "(secret)"
				} else {
					if secretVar(e.Name) {
						t.Errorf("%s: env %s is given in the manifest: take it from a Secret", where, e.Name)
					}
					env[e.Name] = e.Value
				}
			}
			if _, ok := env["OUTBOX_DATABASE_URL"]; !ok {
				t.Errorf("%s: container %s gets no OUTBOX_DATABASE_URL", where, c.Name)
			}

			// Never root.
			psc, csc := spec.SecurityContext, c.SecurityContext
			nonRoot := csc.RunAsNonRoot != nil && *csc.RunAsNonRoot || csc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
			if !nonRoot {
				t.Errorf("%s: container %s may run as root: set runAsNonRoot: true", where, c.Name)
			}
			for _, u := range []*int64{psc.RunAsUser, csc.RunAsUser} {
				if u != nil && *u == 0 {
					t.Errorf("%s: container %s: runAsUser 0", where, c.Name)
				}
			}
			if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
				t.Errorf("%s: container %s: set allowPrivilegeEscalation: false", where, c.Name)
			}
			if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
				t.Errorf("%s: container %s: set readOnlyRootFilesystem: true (the relay writes no files)", where, c.Name)
			}
			if !slices.Contains(csc.Capabilities.Drop, "ALL") {
				t.Errorf("%s: container %s: drop ALL capabilities", where, c.Name)
			}
			for _, res := range []string{"cpu", "memory"} {
				if c.Resources.Requests[res] == "" || c.Resources.Limits[res] == "" {
					t.Errorf("%s: container %s: no %s request and limit", where, c.Name, res)
				}
			}
			owners = append(owners, podOwner{o, c, cmd, args, env})
		}
	}

	// Every key of a ConfigMap or Secret is read by a container that loads it, and
	// secrets are in Secrets.
	for _, o := range objs {
		if o.Kind != "ConfigMap" && o.Kind != "Secret" {
			continue
		}
		users := loaders[o.Kind+"/"+o.Metadata.Name]
		for k := range o.Data {
			if o.Kind == "ConfigMap" && secretVar(k) {
				t.Errorf("%s: ConfigMap %s holds %s: put it in the Secret", o.file, o.Metadata.Name, k)
			}
		}
		keys := append(slices.Sorted(maps.Keys(o.Data)), slices.Sorted(maps.Keys(o.StringData))...)
		for _, k := range keys {
			read := len(users) == 0 // a Secret referenced by secretKeyRef only is checked above
			for _, u := range users {
				if _, ok := u.envs[k]; ok {
					read = true
				}
			}
			if !read {
				t.Errorf("%s: %s %s: key %s is read by none of the commands that load it", o.file, o.Kind, o.Metadata.Name, k)
			}
		}
	}

	// The relays: several, probed and scraped on the --metrics-addr port, given time to
	// drain.
	var dep *podOwner
	for i := range owners {
		if owners[i].obj.Kind == "Deployment" && owners[i].cmd.command == "relay" {
			if dep != nil {
				t.Fatalf("two relay Deployments: %s and %s", dep.obj.file, owners[i].obj.file)
			}
			dep = &owners[i]
		}
	}
	if dep == nil {
		t.Fatalf("%s: no Deployment runs outbox relay", k8sDir)
	}
	where := dep.obj.file + ": Deployment " + dep.obj.Metadata.Name
	if r := dep.obj.Spec.Replicas; r == nil || *r < 2 {
		t.Errorf("%s: want several replicas (relays share the shards and take over from each other)", where)
	}
	if !subset(dep.obj.Spec.Selector.MatchLabels, dep.obj.Spec.Template.Metadata.Labels) {
		t.Errorf("%s: selector %v does not match the pod labels %v", where, dep.obj.Spec.Selector.MatchLabels, dep.obj.Spec.Template.Metadata.Labels)
	}
	if _, ok := dep.env["OUTBOX_BROKER"]; !ok {
		t.Errorf("%s: no OUTBOX_BROKER (in the Secret: a broker URL may hold credentials)", where)
	}

	addr, ok := setting(relay, "metrics-addr", dep.args, dep.env)
	if !ok || addr == "" {
		t.Fatalf("%s: no --metrics-addr (OUTBOX_METRICS_ADDR): the probes and Prometheus need it", where)
	}
	port := metricsPort(t, where, addr)
	portName := ""
	for _, p := range dep.c.Ports {
		if p.ContainerPort == port {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Errorf("%s: no containerPort %d (--metrics-addr %s), or it has no name", where, port, addr)
	}
	resolves := func(p intOrString) bool {
		return string(p) == strconv.Itoa(port) || portName != "" && string(p) == portName
	}
	for _, pc := range []struct {
		name string
		p    *probe
		path string
		must bool
	}{
		{"livenessProbe", dep.c.LivenessProbe, "/healthz", true},
		{"readinessProbe", dep.c.ReadinessProbe, "/readyz", true},
		{"startupProbe", dep.c.StartupProbe, "/healthz", false},
	} {
		if pc.p == nil {
			if pc.must {
				t.Errorf("%s: no %s", where, pc.name)
			}
			continue
		}
		if pc.p.HTTPGet == nil || pc.p.HTTPGet.Path != pc.path || !resolves(pc.p.HTTPGet.Port) {
			t.Errorf("%s: %s %+v: want httpGet %s on port %d (--metrics-addr %s)", where, pc.name, pc.p.HTTPGet, pc.path, port, addr)
		}
	}

	grace, _ := setting(relay, "shutdown-grace", dep.args, dep.env)
	g := parseDuration(t, "--shutdown-grace", grace)
	tg := 30 // Kubernetes's default
	if p := dep.obj.Spec.Template.Spec.TerminationGracePeriodSeconds; p != nil {
		tg = *p
	}
	if time.Duration(tg)*time.Second <= g {
		t.Errorf("%s: terminationGracePeriodSeconds %d is not above --shutdown-grace %s: Kubernetes would kill the relay while it drains", where, tg, grace)
	}

	// The Service and the ServiceMonitor reach that port, and the PodDisruptionBudget the pods.
	svcs := ofKind(objs, "Service")
	if len(svcs) == 0 {
		t.Errorf("%s: no Service for the metrics", k8sDir)
	}
	for _, svc := range svcs {
		if !subset(svc.Spec.ServiceSelector, dep.obj.Spec.Template.Metadata.Labels) {
			t.Errorf("%s: Service %s selector %v does not select the relays", svc.file, svc.Metadata.Name, svc.Spec.ServiceSelector)
		}
		okPort := false
		for _, p := range svc.Spec.Ports {
			okPort = okPort || resolves(p.TargetPort)
		}
		if !okPort {
			t.Errorf("%s: Service %s: no port targets the metrics port %d", svc.file, svc.Metadata.Name, port)
		}
		if !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("%s: Service %s: set publishNotReadyAddresses, so that a relay that is not ready is still scraped", svc.file, svc.Metadata.Name)
		}
	}
	for _, sm := range ofKind(objs, "ServiceMonitor") {
		var svc *k8sObject
		for _, s := range svcs {
			if subset(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
				svc = s
			}
		}
		if svc == nil {
			t.Errorf("%s: ServiceMonitor %s selects no Service", sm.file, sm.Metadata.Name)
			continue
		}
		for _, ep := range sm.Spec.Endpoints {
			named := false
			for _, p := range svc.Spec.Ports {
				named = named || p.Name == ep.Port && resolves(p.TargetPort)
			}
			if !named || ep.Path != "" && ep.Path != "/metrics" {
				t.Errorf("%s: ServiceMonitor endpoint %+v: want port %s's metrics port at /metrics", sm.file, ep, svc.Metadata.Name)
			}
		}
	}
	for _, pdb := range ofKind(objs, "PodDisruptionBudget") {
		if !subset(pdb.Spec.Selector.MatchLabels, dep.obj.Spec.Template.Metadata.Labels) {
			t.Errorf("%s: PodDisruptionBudget %s selects no relay", pdb.file, pdb.Metadata.Name)
		}
	}

	// The Kustomization lists files that exist, and no Secret with placeholders.
	var kustomization k8sObject
	readYAML(t, filepath.Join(k8sDir, "kustomization.yaml"), &kustomization)
	for _, r := range kustomization.Resources {
		path := filepath.Join(k8sDir, r)
		if _, err := os.Stat(path); err != nil {
			t.Errorf("kustomization.yaml: resource %s: %v", r, err)
		}
		for _, o := range objs {
			if o.file == path && o.Kind == "Secret" {
				t.Errorf("kustomization.yaml: %s holds example Secrets: keep it out", r)
			}
		}
	}
	if !slices.Contains(kustomization.Resources, filepath.Base(dep.obj.file)) {
		t.Errorf("kustomization.yaml does not list %s", dep.obj.file)
	}
}

// ---- the PrometheusRule ----

const promRuleHeader = `# The alert rules of deploy/prometheus/outbox-alerts.yml as a PrometheusRule, for the
# Prometheus Operator (needs its CRDs; not part of kustomization.yaml). Add the label your
# Prometheus selects rules by (release: ..., say).
#
# Generated: edit deploy/prometheus/outbox-alerts.yml, then run
#   go test ./deploy -run TestPrometheusRuleMatchesAlertRules -update
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: outbox
  labels:
    app.kubernetes.io/name: outbox-relay
    app.kubernetes.io/part-of: outbox
spec:
`

// TestPrometheusRuleMatchesAlertRules keeps kubernetes/prometheus-rule.yaml equal to the
// rule file; with -update it rewrites it.
func TestPrometheusRuleMatchesAlertRules(t *testing.T) {
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		i := bytes.Index(raw, []byte("\ngroups:\n"))
		if i < 0 {
			t.Fatalf("%s: no top-level groups:", rulesFile)
		}
		var b strings.Builder
		b.WriteString(promRuleHeader)
		for _, line := range strings.SplitAfter(string(raw[i+1:]), "\n") {
			if strings.TrimSpace(line) != "" {
				b.WriteString("  ")
			}
			b.WriteString(line)
		}
		if err := os.WriteFile(promRuleFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var want struct {
		Groups []any `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Groups []any `yaml:"groups"`
		} `yaml:"spec"`
	}
	readYAML(t, promRuleFile, &got)
	if got.Kind != "PrometheusRule" {
		t.Errorf("%s: kind %q, want PrometheusRule", promRuleFile, got.Kind)
	}
	if !reflect.DeepEqual(got.Spec.Groups, want.Groups) {
		t.Errorf("%s differs from %s: run go test ./deploy -run TestPrometheusRuleMatchesAlertRules -update", promRuleFile, rulesFile)
	}
}
