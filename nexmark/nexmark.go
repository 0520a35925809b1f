// Package nexmark generates the events of the Nexmark benchmark (an auction
// site: persons, auctions, bids) deterministically from a seed, encodes them
// as the JSON records cairn's queries read, and decodes those records without
// allocating (for operators).
//
// The generator follows the Nexmark specification as Flink's and Beam's
// generators implement it: one person for three auctions for 46 bids, ids
// from 1000, hot auctions, bidders and sellers, the same field distributions,
// and event time advancing by 1/rate per event from a base time. It differs
// in one way that matters for a checkpointed source: each event is drawn
// from a random stream of its own (the seed and the event number), so event
// n can be generated without the n-1 before it — a restored job restarts the
// source at its checkpoint's position, as it would a JetStream stream.
package nexmark

import (
	"errors"
	"fmt"
)

// ErrConfig is returned for a generator configuration that cannot be used.
var ErrConfig = errors.New("nexmark: bad configuration")

// Default values of Config.
const (
	// DefaultRate is Beam's default first-event rate: 10,000 events per
	// second of event time.
	DefaultRate = 10_000
	// DefaultBaseTime is the event time of the first event, Unix ms
	// (2026-01-01T00:00:00Z): fixed, so a seed names one sequence of events.
	DefaultBaseTime = 1_767_225_600_000
)

// Config is what the generator generates: the nexmark input of a job file
// (`input: {nexmark: {...}}`) and the flags of `cairn nexmark gen`.
type Config struct {
	// Seed selects the sequence of events.
	Seed uint64 `yaml:"seed" json:"seed"`
	// Events is how many events there are (0: unbounded).
	Events uint64 `yaml:"events" json:"events"`
	// Rate is how many events fall in one second of event time (default
	// DefaultRate). It sets event time only: an in-process source
	// generates as fast as the job consumes.
	Rate uint64 `yaml:"rate" json:"rate"`
	// BaseTime is the first event's time, Unix ms (default DefaultBaseTime).
	BaseTime int64 `yaml:"base_time" json:"base_time"`
}

// SetDefaults fills the fields left out.
func (c *Config) SetDefaults() {
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.BaseTime == 0 {
		c.BaseTime = DefaultBaseTime
	}
}

// Validate checks a configuration after SetDefaults.
func (c *Config) Validate() error {
	if c.Rate > 1_000_000_000 {
		return fmt.Errorf("%w: rate %d: at most 1e9 events per second of event time", ErrConfig, c.Rate)
	}
	if c.BaseTime < 0 {
		return fmt.Errorf("%w: base_time %d: must be a Unix time in milliseconds after 1970", ErrConfig, c.BaseTime)
	}
	return nil
}

// Time is the event time of event n (0-based), Unix ms: Flink's
// timestampForEvent, base + n × (10^6 / rate) µs, in integer arithmetic.
func (c Config) Time(n uint64) int64 {
	return c.BaseTime + int64(n*1000/c.Rate)
}
