package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

const (
	listLimitDefault = 50
	listLimitMax     = 1000
	previewLimit     = 20
)

// listFilter is the dead-letter list's filter form, as the query string carries it.
// Since and Until are resolved to absolute times when parsed, so a confirmation page
// hands its action exactly the times it counted with.
type listFilter struct {
	Topic, Key, Error string
	Since, Until      time.Time
	SinceText         string // as typed, shown back in the form
	UntilText         string
	Limit             int
}

// parseListFilter reads the filter fields of v. now resolves durations ("2h" ago).
func parseListFilter(v url.Values, now time.Time) (listFilter, error) {
	f := listFilter{
		Topic: strings.TrimSpace(v.Get("topic")), Key: strings.TrimSpace(v.Get("key")), Error: strings.TrimSpace(v.Get("error")),
		SinceText: strings.TrimSpace(v.Get("since")), UntilText: strings.TrimSpace(v.Get("until")),
		Limit: listLimitDefault,
	}
	var err error
	if f.Since, err = parsePointInTime(f.SinceText, now); err != nil {
		return f, fmt.Errorf("since: %w", err)
	}
	if f.Until, err = parsePointInTime(f.UntilText, now); err != nil {
		return f, fmt.Errorf("until: %w", err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, fmt.Errorf("since (%s) is not before until (%s)", utc(f.Since), utc(f.Until))
	}
	if s := strings.TrimSpace(v.Get("limit")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > listLimitMax {
			return f, fmt.Errorf("limit: want a number from 1 to %d, not %q", listLimitMax, s)
		}
		f.Limit = n
	}
	return f, f.dead(false).Validate()
}

// parsePointInTime reads an RFC 3339 time, a UTC date and time ("2024-05-01 12:00"), or
// a duration meaning that long before now ("90m", "2h", "7d"). Empty is the zero time.
func parsePointInTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	if d, err := parseAgo(s); err == nil {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time: want a duration ago (90m, 2h, 7d), a UTC time (2024-05-01 12:00) or RFC 3339", s)
}

// parseAgo parses a non-negative duration, with d for days (7d, 1d12h).
func parseAgo(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 100000 {
			return 0, errors.New("bad days")
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("bad duration")
	}
	return days + d, nil
}

// dead returns the filter as an outboxdriver.DeadFilter, with or without its limit.
func (f listFilter) dead(withLimit bool) outboxdriver.DeadFilter {
	d := outboxdriver.DeadFilter{Topic: f.Topic, Key: f.Key, ErrorContains: f.Error, Since: f.Since, Until: f.Until}
	if withLimit {
		d.Limit = f.Limit
	}
	return d
}

// values renders the filter for links and hidden fields, times as absolute RFC 3339.
func (f listFilter) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("topic", f.Topic)
	set("key", f.Key)
	set("error", f.Error)
	if !f.Since.IsZero() {
		v.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		v.Set("until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	if f.Limit != listLimitDefault {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	return v
}

// Fields returns the filter's fields for hidden inputs, in a stable order.
func (f listFilter) Fields() []field {
	v := f.values()
	var out []field
	for _, k := range []string{"topic", "key", "error", "since", "until", "limit"} {
		if s := v.Get(k); s != "" {
			out = append(out, field{k, s})
		}
	}
	return out
}

type field struct{ Name, Value string }

// Href is the link to the dead-letter list with this filter.
func (f listFilter) Href() template.URL {
	if q := f.values().Encode(); q != "" {
		return template.URL("/dead?" + q)
	}
	return "/dead"
}

// Describe says what the filter selects: `topic="orders" error~"timeout"`.
func (f listFilter) Describe() string { return f.dead(false).String() }

type deadListData struct {
	Filter    listFilter
	FilterErr string
	Letters   []outboxdriver.DeadLetter
	Total     int // matching, without the limit
	Done      string
	Now       time.Time
}

// More reports whether more dead letters match than the list shows.
func (d deadListData) More() bool { return d.Total > len(d.Letters) }

func (h *Handler) deadList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := parseListFilter(q, h.now())
	d := deadListData{Filter: f, Now: h.now(), Done: doneMessage(q)}
	if err != nil {
		d.FilterErr = err.Error()
		h.renderPage(w, r, http.StatusBadRequest, "dead", page{Nav: "dead", Data: d})
		return
	}
	ctx := r.Context()
	if d.Total, err = h.cfg.Admin.DeadCount(ctx, f.dead(false)); err != nil {
		h.storeFailed(w, r, "count dead letters", err)
		return
	}
	if d.Letters, err = h.cfg.Admin.DeadList(ctx, f.dead(true)); err != nil {
		h.storeFailed(w, r, "list dead letters", err)
		return
	}
	h.renderPage(w, r, http.StatusOK, "dead", page{Nav: "dead", Data: d})
}

// doneMessage renders the result of a replay or purge that redirected to the list.
func doneMessage(q url.Values) string {
	n, err := strconv.Atoi(q.Get("n"))
	if err != nil || n < 0 {
		return ""
	}
	letters := "dead letters"
	if n == 1 {
		letters = "dead letter"
	}
	switch q.Get("done") {
	case "replay":
		return fmt.Sprintf("Replayed %d %s: relays publish them again, with their original ids, within their poll interval.", n, letters)
	case "purge":
		return fmt.Sprintf("Purged %d %s.", n, letters)
	}
	return ""
}

func (h *Handler) deadShow(w http.ResponseWriter, r *http.Request) {
	id, err := outbox.ParseID(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, http.StatusNotFound, "That is not a message id.")
		return
	}
	dls, err := h.cfg.Admin.DeadList(r.Context(), outboxdriver.DeadFilter{IDs: []outbox.ID{id}})
	if err != nil {
		h.storeFailed(w, r, "read the dead letter", err)
		return
	}
	if len(dls) == 0 {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("No dead letter has id %s: it may have been replayed or purged (pending and published messages are not dead letters).", id))
		return
	}
	dl := dls[0]
	h.renderPage(w, r, http.StatusOK, "detail", page{Nav: "dead", Data: detailData{
		Letter: dl, Headers: sortedHeaders(dl.Headers), Payload: renderPayload(dl.Payload, dl.ContentType), Now: h.now(),
	}})
}

type detailData struct {
	Letter  outboxdriver.DeadLetter
	Headers []field
	Payload payloadView
	Now     time.Time
}

// selection is what a replay or purge acts on: a verb, the list's filter (to go back
// to), and the scope within it.
type selection struct {
	Action string // "replay" or "purge"
	Scope  string // "selected": the ids; "shown": the filter with its limit; "all": the filter without it
	IDs    []outbox.ID
	List   listFilter
}

// parseSelection reads a selection from v (the confirmation page's query, or its form).
func parseSelection(v url.Values, now time.Time) (selection, error) {
	s := selection{Action: v.Get("action"), Scope: v.Get("scope")}
	if do := v.Get("do"); do != "" { // a button of the list or detail page: "replay-selected"
		s.Action, s.Scope, _ = strings.Cut(do, "-")
	}
	if s.Action != "replay" && s.Action != "purge" {
		return s, fmt.Errorf("unknown action %q: want replay or purge", s.Action)
	}
	var err error
	if s.List, err = parseListFilter(v, now); err != nil {
		return s, err
	}
	switch s.Scope {
	case "selected":
		for _, raw := range v["id"] {
			id, err := outbox.ParseID(strings.TrimSpace(raw))
			if err != nil {
				return s, fmt.Errorf("id: %w", err)
			}
			s.IDs = append(s.IDs, id)
		}
		if len(s.IDs) == 0 {
			return s, errors.New("no dead letter is selected: tick the ones to " + s.Action + ", or use the buttons for the whole list")
		}
	case "shown", "all":
	default:
		return s, fmt.Errorf("unknown scope %q: want selected, shown or all", s.Scope)
	}
	return s, nil
}

// filter is the outboxdriver.DeadFilter the selection acts on.
func (s selection) filter() outboxdriver.DeadFilter {
	switch s.Scope {
	case "selected":
		return outboxdriver.DeadFilter{IDs: s.IDs}
	case "shown":
		return s.List.dead(true)
	}
	return s.List.dead(false)
}

type confirmData struct {
	Sel         selection
	Count       int
	Description string
	Preview     []outboxdriver.DeadLetter
	IDs         []string
	Now         time.Time
}

// More reports how many the preview leaves out.
func (d confirmData) More() int { return d.Count - len(d.Preview) }

func (h *Handler) deadConfirm(w http.ResponseWriter, r *http.Request) {
	sel, err := parseSelection(r.URL.Query(), h.now())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	f := sel.filter()
	ctx := r.Context()
	n, err := h.cfg.Admin.DeadCount(ctx, f)
	if err != nil {
		h.storeFailed(w, r, "count dead letters", err)
		return
	}
	d := confirmData{Sel: sel, Count: n, Now: h.now()}
	if n == 0 {
		d.Description = "there are no dead letters"
		if parts := f.String(); parts != "" {
			d.Description = "no dead letters match " + parts
		}
	} else {
		d.Description = f.Describe(n)
		pf := f
		pf.Limit = min(n, previewLimit)
		if d.Preview, err = h.cfg.Admin.DeadList(ctx, pf); err != nil {
			h.storeFailed(w, r, "list dead letters", err)
			return
		}
	}
	for _, id := range sel.IDs {
		d.IDs = append(d.IDs, id.String())
	}
	h.renderPage(w, r, http.StatusOK, "confirm", page{Nav: "dead", Data: d})
}

func (h *Handler) deadAct(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	sel, err := parseSelection(r.PostForm, h.now())
	if err == nil && "/dead/"+sel.Action != r.URL.Path {
		err = fmt.Errorf("the form's action %q does not match %s", sel.Action, r.URL.Path)
	}
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	f := sel.filter()
	var n int
	if sel.Action == "replay" {
		n, err = h.cfg.Admin.DeadReplay(r.Context(), f)
	} else {
		n, err = h.purge(r.Context(), f)
	}
	if err != nil {
		h.storeFailed(w, r, sel.Action+" dead letters", err)
		return
	}
	h.cfg.Logger.Info("console: "+sel.Action+" of dead letters", "count", n, "filter", f.String(), "limit", f.Limit, "remote", r.RemoteAddr)
	back := sel.List.values()
	back.Set("done", sel.Action)
	back.Set("n", strconv.Itoa(n))
	http.Redirect(w, r, h.base+"/dead?"+back.Encode(), http.StatusSeeOther)
}

// purge deletes the dead letters of f. DeadPurge refuses a filter without a condition,
// so that nobody deletes everything by forgetting a field; here the operator chose
// "all" on a confirmation page that said so, which is DeadPurgeAll, and "the newest N"
// becomes their ids.
func (h *Handler) purge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if !f.IsEmpty() {
		return h.cfg.Admin.DeadPurge(ctx, f)
	}
	if f.Limit == 0 {
		return h.cfg.Admin.DeadPurgeAll(ctx)
	}
	dls, err := h.cfg.Admin.DeadList(ctx, f)
	if err != nil || len(dls) == 0 {
		return 0, err
	}
	ids := make([]outbox.ID, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	return h.cfg.Admin.DeadPurge(ctx, outboxdriver.DeadFilter{IDs: ids})
}
