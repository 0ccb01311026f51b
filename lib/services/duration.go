package services

import (
	"encoding/json"
	"time"

	"github.com/gravitational/trace"
)

// Duration is a time.Duration written as "12h" or "30m" in JSON and YAML,
// the way operators write it, rather than as nanoseconds.
type Duration time.Duration

// Value returns the plain time.Duration.
func (d Duration) Value() time.Duration { return time.Duration(d) }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON accepts "1h30m" strings and, for hand-written JSON, plain
// seconds as a number.
func (d *Duration) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return trace.BadParameter("invalid duration %q: %v", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(data, &secs); err != nil {
		return trace.BadParameter("invalid duration %s: want a string like \"1h30m\"", data)
	}
	*d = Duration(time.Duration(secs * float64(time.Second)))
	return nil
}

// MarshalText writes the duration as a string (used by YAML encoders).
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(time.Duration(d).String()), nil
}

// UnmarshalText parses "1h30m".
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return trace.BadParameter("invalid duration %q: %v", text, err)
	}
	*d = Duration(v)
	return nil
}
