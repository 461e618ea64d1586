package testproxy

import (
	"sync"
	"sync/atomic"

	"github.com/Shopify/toxiproxy/v2/toxics"
)

// silenceToxicName is the toxic type behind Proxy.Silence.
const silenceToxicName = "outbox_silence"

// silenceSwitch turns a proxy's silence toxic on and off. A toxic is made from JSON, so
// it finds its switch by index in silences.
type silenceSwitch struct {
	on       atomic.Bool
	dropped  atomic.Int64  // chunks
	keepEnds atomic.Bool   // a dead connection's close is lost too (Partition)
	ended    chan struct{} // closed when the test ends: the lost closes are delivered
}

var (
	silencesMu sync.Mutex
	silences   []*silenceSwitch
)

func init() { toxics.Register(silenceToxicName, new(silenceToxic)) }

// silenceToxic forwards data while its switch is off. A chunk that arrives while it is on
// is dropped, and so is everything after it on that connection and direction (its close
// as well, after Partition).
type silenceToxic struct {
	Switch int `json:"switch"`
}

// silenceState is one connection's, in one direction: whether it carried data while
// silenced. It outlives the toxic chain's rebuilds (other toxics added and removed).
type silenceState struct{ dead bool }

func (t *silenceToxic) NewState() any { return new(silenceState) }

func (t *silenceToxic) Pipe(stub *toxics.ToxicStub) {
	silencesMu.Lock()
	sw := silences[t.Switch]
	silencesMu.Unlock()
	state := stub.State.(*silenceState)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil && state.dead && sw.keepEnds.Load() { // the other end keeps waiting
				select {
				case <-stub.Interrupt:
				case <-sw.ended:
					stub.Close()
				}
				return
			}
			if c == nil {
				stub.Close()
				return
			}
			if state.dead || sw.on.Load() {
				state.dead = true
				sw.dropped.Add(1)
				continue
			}
			stub.Output <- c
		}
	}
}
