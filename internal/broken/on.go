//go:build outbox_broken

package broken

import (
	"os"
	"slices"
	"strings"
)

var on = strings.Split(os.Getenv(EnvVar), ",")

// Has reports whether bug b is switched on by OUTBOX_BROKEN.
func Has(b Bug) bool { return slices.Contains(on, string(b)) }
