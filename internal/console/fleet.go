package console

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Outbox is one outbox of a fleet console (Config.Outboxes).
type Outbox struct {
	// Name is the outbox's name, unique in the fleet: its pages are under /o/NAME/.
	Name string
	// Admin is the outbox's store; nil while the process has not connected to it (it is
	// listed with its State, without a link).
	Admin outboxdriver.Admin
	// RelayID is the id of this process's relay of the outbox, marked in its relays
	// table.
	RelayID string
	// State says why this process's relay of the outbox does not run now ("parked",
	// "not served: ..."); empty while it runs.
	State string
}

// fleetStatusTTL is how long a fleet console's overview keeps the outboxes' statuses:
// every viewer's refresh within it is answered from them, so that a fleet of a thousand
// outboxes costs a thousand status reads per interval, not per page load.
const fleetStatusTTL = 15 * time.Second

// fleetStatusWorkers is how many status reads a fleet overview runs at once, and
// fleetStatusTimeout how long each may take.
const (
	fleetStatusWorkers = 8
	fleetStatusTimeout = 10 * time.Second
)

// fleetShown is the most outboxes a fleet overview lists: the worst ones, and a filter
// by name finds the others.
const fleetShown = 200

// fleet is a fleet console's state: the consoles of its outboxes and the overview's
// last statuses.
type fleet struct {
	mu      sync.Mutex
	members map[string]*Handler // by name, made on an outbox's first page

	readMu sync.Mutex // held while the statuses are read
	read   time.Time  // when they were read
	rows   []fleetRow // as read then, worst first
}

// fleetRow is one outbox's line of the fleet overview.
type fleetRow struct {
	Outbox
	Href   string // its pages; "" while it has no store
	Status *outboxdriver.Status
	Error  string
}

type fleetData struct {
	Now    time.Time
	Read   time.Time // when the statuses were read
	Rows   []fleetRow
	Total  int // outboxes in the fleet
	Match  int // outboxes whose name has Filter
	Filter string
	Paused bool
}

// fleetOverview lists the outboxes, worst first.
func (h *Handler) fleetOverview(w http.ResponseWriter, r *http.Request) {
	rows, read := h.fleetRows(r.Context())
	q := r.URL.Query()
	d := fleetData{Now: h.now(), Read: read, Total: len(rows), Filter: strings.TrimSpace(q.Get("q")), Paused: q.Get("refresh") == "off"}
	for _, row := range rows {
		if d.Filter != "" && !strings.Contains(row.Name, d.Filter) {
			continue
		}
		d.Match++
		if len(d.Rows) < fleetShown {
			d.Rows = append(d.Rows, row)
		}
	}
	p := page{Nav: "outboxes", Data: d}
	if h.cfg.Refresh > 0 && !d.Paused {
		p.Refresh = max(1, int(max(h.cfg.Refresh, fleetStatusTTL).Round(time.Second)/time.Second))
	}
	h.renderPage(w, r, http.StatusOK, "fleet", p)
}

// fleetRows returns every outbox's row, worst first, reading the statuses again when the
// last read is older than fleetStatusTTL; read is when they were read.
func (h *Handler) fleetRows(ctx context.Context) (rows []fleetRow, read time.Time) {
	f := h.fleet
	f.readMu.Lock()
	defer f.readMu.Unlock() // one read at a time: the viewers who come meanwhile get its rows
	if now := h.now(); now.Sub(f.read) < fleetStatusTTL && f.rows != nil {
		return f.rows, f.read
	}
	outboxes := h.cfg.Outboxes()
	f.forget(outboxes)
	rows = make([]fleetRow, len(outboxes))
	var wg sync.WaitGroup
	work := make(chan int)
	for range min(fleetStatusWorkers, len(outboxes)) {
		wg.Go(func() {
			for i := range work {
				rows[i] = readRow(ctx, outboxes[i])
			}
		})
	}
	for i := range outboxes {
		work <- i
	}
	close(work)
	wg.Wait()
	slices.SortStableFunc(rows, func(a, b fleetRow) int {
		if c := compareRows(b, a); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if ctx.Err() == nil { // a read cut short by a viewer who left is not kept
		f.rows, f.read = rows, h.now()
	}
	return rows, h.now()
}

// readRow reads one outbox's status.
func readRow(ctx context.Context, o Outbox) fleetRow {
	row := fleetRow{Outbox: o}
	if o.Admin == nil {
		return row
	}
	row.Href = outboxPath(o.Name) + "/"
	ctx, cancel := context.WithTimeout(ctx, fleetStatusTimeout)
	defer cancel()
	st, err := o.Admin.Status(ctx)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.Status = &st
	return row
}

// compareRows orders the overview: outboxes whose status could not be read, then those
// not connected, then by health (outboxdriver.CompareHealth); above 0 when a is the
// worse.
func compareRows(a, b fleetRow) int {
	rank := func(r fleetRow) int {
		switch {
		case r.Error != "":
			return 2
		case r.Status == nil:
			return 1
		}
		return 0
	}
	if c := rank(a) - rank(b); c != 0 || rank(a) != 0 {
		return c
	}
	return outboxdriver.CompareHealth(a.Status, b.Status)
}

// outboxPath is where an outbox's pages are in a fleet console.
func outboxPath(name string) string { return "/o/" + url.PathEscape(name) }

// outboxPage serves /o/NAME/...: the page of the outbox's own console, made on its first
// request (and again when the outbox's store changed: its relay connected anew).
func (h *Handler) outboxPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var o *Outbox
	for _, c := range h.cfg.Outboxes() {
		if c.Name == name {
			o = &c
			break
		}
	}
	switch {
	case o == nil:
		h.fail(w, r, http.StatusNotFound, "This process serves no outbox of that name (any more).")
		return
	case o.Admin == nil:
		h.fail(w, r, http.StatusServiceUnavailable, "This process is not connected to that outbox's database now: "+o.State)
		return
	}
	m := h.member(*o)
	r2 := new(http.Request)
	*r2 = *r
	u := *r.URL
	u.Path, u.RawPath = "/"+r.PathValue("rest"), ""
	r2.URL = &u
	m.mux.ServeHTTP(w, r2) // authenticated and checked by h's guard
}

// member returns the console of o, made on first use.
func (h *Handler) member(o Outbox) *Handler {
	f := h.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.members[o.Name]; m != nil && m.cfg.Admin == o.Admin && m.cfg.RelayID == o.RelayID {
		return m
	}
	cfg := h.cfg
	cfg.Outboxes, cfg.Admin, cfg.RelayID, cfg.RelayStats = nil, o.Admin, o.RelayID, nil
	m := &Handler{cfg: cfg, access: h.access, now: h.now, base: outboxPath(o.Name), outbox: o.Name, pages: h.pages, css: h.css}
	m.routes(false)
	f.members[o.Name] = m
	return m
}

// forget drops the consoles of the outboxes the fleet no longer has.
func (f *fleet) forget(keep []Outbox) {
	names := map[string]bool{}
	for _, o := range keep {
		names[o.Name] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for name := range f.members {
		if !names[name] {
			delete(f.members, name)
		}
	}
}
