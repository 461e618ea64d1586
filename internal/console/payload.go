package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

const (
	// textLimit is how much of a text payload the detail page shows.
	textLimit = 64 << 10
	// hexLimit is how much of a binary payload the hex dump shows.
	hexLimit = 4 << 10
	// base64Limit is how much of a binary payload the base64 block holds.
	base64Limit = 48 << 10
	// listErrorLimit is how many characters of the last error the list shows.
	listErrorLimit = 120
)

// payloadView is a payload made safe to show: as text when it is printable UTF-8
// (indented when it is JSON), otherwise as a hex dump and base64. html/template escapes
// all of it; the limits keep a large payload from making a huge page.
type payloadView struct {
	Size      int
	Text      string // set for text
	JSON      bool   // Text is indented JSON
	Hex       string // set for binary
	Base64    string // set for binary
	Shown     int    // bytes of the payload shown
	Truncated bool
}

func renderPayload(p []byte, contentType string) payloadView {
	v := payloadView{Size: len(p)}
	if isText(p) {
		if (outbox.IsJSONContentType(contentType) || json.Valid(p)) && len(p) <= textLimit {
			var b bytes.Buffer
			if json.Indent(&b, p, "", "  ") == nil {
				v.Text, v.JSON, v.Shown = b.String(), true, len(p)
				return v
			}
		}
		s := p
		if len(s) > textLimit {
			s = s[:textLimit]
			for len(s) > 0 && !utf8.Valid(s) { // do not cut a character in two
				s = s[:len(s)-1]
			}
			v.Truncated = true
		}
		v.Text, v.Shown = string(s), len(s)
		return v
	}
	v.Hex = hexDump(p[:min(len(p), hexLimit)])
	v.Base64 = base64.StdEncoding.EncodeToString(p[:min(len(p), base64Limit)])
	v.Shown = min(len(p), hexLimit)
	v.Truncated = len(p) > hexLimit
	return v
}

// isText reports whether p is UTF-8 without control characters other than white space.
func isText(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	for _, r := range string(p) {
		if r == '\n' || r == '\r' || r == '\t' {
			continue
		}
		if unicode.IsControl(r) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// hexDump renders p as xxd does: offset, 16 bytes in hex, and the printable ASCII.
func hexDump(p []byte) string {
	var b strings.Builder
	for off := 0; off < len(p); off += 16 {
		line := p[off:min(off+16, len(p))]
		fmt.Fprintf(&b, "%08x  ", off)
		for i := range 16 {
			if i < len(line) {
				fmt.Fprintf(&b, "%02x ", line[i])
			} else {
				b.WriteString("   ")
			}
			if i == 7 {
				b.WriteByte(' ')
			}
		}
		b.WriteString(" |")
		for _, c := range line {
			if c >= 0x20 && c < 0x7f {
				b.WriteByte(c)
			} else {
				b.WriteByte('.')
			}
		}
		b.WriteString("|\n")
	}
	return b.String()
}

func sortedHeaders(h map[string]string) []field {
	out := make([]field, 0, len(h))
	for k, v := range h {
		out = append(out, field{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// oneLine shortens s to its first line and at most n runes, for tables.
func oneLine(s string, n int) string {
	s, _, more := strings.Cut(s, "\n")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > n {
		return string([]rune(s)[:n-1]) + "…"
	}
	if more {
		s += " …"
	}
	return s
}

// utc formats a time for pages: UTC, to the second.
func utc(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// age renders a duration for people: 1h2m3s, 4.2s, 15ms.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < 48*time.Hour:
		return d.Round(time.Second).String()
	default:
		days := d / (24 * time.Hour)
		return fmt.Sprintf("%dd%s", days, (d - days*24*time.Hour).Round(time.Minute))
	}
}

// perSecond renders a rate.
func perSecond(r float64) string {
	switch {
	case r <= 0:
		return "0/s"
	case r < 10:
		return fmt.Sprintf("%.2f/s", r)
	default:
		return fmt.Sprintf("%.0f/s", math.Round(r))
	}
}

var funcs = template.FuncMap{
	"utc": utc,
	"age": age,
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return age(now.Sub(t)) + " ago"
	},
	"oneLine":   func(s string) string { return oneLine(s, listErrorLimit) },
	"perSecond": perSecond,
	"liveRelays": func(relays []outboxdriver.RelayInfo) int {
		n := 0
		for _, r := range relays {
			if r.Live {
				n++
			}
		}
		return n
	},
	"pendingAge": func(d time.Duration, pending int64) string {
		if pending == 0 {
			return "-"
		}
		return age(d)
	},
	"bytes": func(n int) string {
		switch {
		case n < 1<<10:
			return fmt.Sprintf("%d bytes", n)
		case n < 1<<20:
			return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	},
	"orNone": func(s string) string {
		if s == "" {
			return "(none)"
		}
		return s
	},
}
