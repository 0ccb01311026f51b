// Package schema versions what Postern stores in its backend, so that a
// data dir or an etcd prefix says which Postern can read it.
//
// The version lives in the backend itself (Key), next to the data it
// describes: a data dir copied to another machine, an etcd prefix shared by
// several auth servers and a backup all carry it. When an auth server opens
// its backend (Migrate):
//   - a backend written by a newer Postern (a higher version) is refused,
//     with both versions named: an older binary must not rewrite data whose
//     layout it does not know, and a rollback is a restore of a backup
//     taken before the upgrade;
//   - an older backend is migrated forward one step at a time, each step
//     recorded in the version item once it has run, so that a step runs
//     once per backend (and a crash between steps resumes at the next one);
//   - an empty backend is stamped with the current version.
//
// Steps must be idempotent: two auth servers of an etcd cluster upgraded
// together may both run a step before one of them records it.
package schema

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/version"
)

// Key is where the backend records its schema version. It sits outside
// every resource prefix, so that no GetRange of resources ever sees it.
const Key = "/schema/version"

// Version is the schema this build writes. Raise it with a new step in
// Steps whenever the layout of stored data changes in a way an older
// Postern would misread.
const Version = 1

// Step migrates a backend from version To-1 to To.
type Step struct {
	// To is the version the backend is at once the step has run.
	To int
	// Name says what the step does (logs and the version item's history).
	Name string
	// Apply rewrites the data; it must be idempotent (see the package doc).
	Apply func(ctx context.Context, b backend.Backend) error
}

// Steps is the migration list of this build, oldest first.
func Steps() []Step {
	return []Step{{
		// Backends of releases before versioning hold the same layout as
		// version 1; the step only records it.
		To:    1,
		Name:  "record the schema version",
		Apply: func(context.Context, backend.Backend) error { return nil },
	}}
}

// Record is the value stored at Key.
type Record struct {
	// Version is the backend's schema version.
	Version int `json:"version"`
	// Applied lists the migration steps run on this backend, oldest first.
	Applied []Applied `json:"applied,omitempty"`
}

// Applied is one migration step that ran.
type Applied struct {
	To      int       `json:"to"`
	Name    string    `json:"name"`
	Postern string    `json:"postern"`
	At      time.Time `json:"at"`
}

// Migrator applies a migration list; Migrate is this build's.
type Migrator struct {
	// Current is the version this code writes; required.
	Current int
	// Steps lead from 0 to Current, one version each; required.
	Steps []Step
	// Logger; nil means logrus with component=backend.schema.
	Logger logrus.FieldLogger
}

// CheckAndSetDefaults validates the migration list.
func (m *Migrator) CheckAndSetDefaults() error {
	if m.Current <= 0 {
		return trace.BadParameter("schema migrator: missing Current")
	}
	steps := append([]Step(nil), m.Steps...)
	sort.Slice(steps, func(i, j int) bool { return steps[i].To < steps[j].To })
	for i, s := range steps {
		if s.To != i+1 || s.Apply == nil {
			return trace.BadParameter("schema migrator: step %d (%q) is out of sequence or has no Apply", s.To, s.Name)
		}
	}
	if len(steps) != m.Current {
		return trace.BadParameter("schema migrator: %d steps lead to version %d, want %d", len(steps), len(steps), m.Current)
	}
	m.Steps = steps
	if m.Logger == nil {
		m.Logger = logrus.WithField("component", "backend.schema")
	}
	return nil
}

// Migrate checks b's schema version against this build's and migrates it
// forward (see the package doc). The auth server calls it once, on open.
func Migrate(ctx context.Context, b backend.Backend, log logrus.FieldLogger) error {
	m := Migrator{Current: Version, Steps: Steps(), Logger: log}
	return trace.Wrap(m.Run(ctx, b))
}

// CheckVersion refuses a schema newer than current, naming both.
func CheckVersion(have, current int) error {
	if have > current {
		return trace.BadParameter("the backend's schema version is %d, newer than version %d of this Postern (%s): "+
			"it was written by a newer Postern; run that one, or restore a backup taken before the upgrade", have, current, version.Version)
	}
	return nil
}

// Read returns b's schema record and the item it was read from (nil when
// the backend records none: empty, or written before versioning).
func Read(ctx context.Context, b backend.Backend) (Record, *backend.Item, error) {
	item, err := b.Get(ctx, Key)
	if trace.IsNotFound(err) {
		return Record{}, nil, nil
	}
	if err != nil {
		return Record{}, nil, trace.Wrap(err)
	}
	var rec Record
	if err := json.Unmarshal(item.Value, &rec); err != nil {
		return Record{}, nil, trace.BadParameter("backend key %s: %v", Key, err)
	}
	return rec, item, nil
}

// maxRaces bounds how often Run starts over because another auth server
// wrote the version item meanwhile; each race means that server progressed.
const maxRaces = 10

// Run checks and migrates b.
func (m Migrator) Run(ctx context.Context, b backend.Backend) error {
	if err := m.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	for range maxRaces {
		err := m.run(ctx, b)
		if trace.IsCompareFailed(err) || trace.IsAlreadyExists(err) {
			continue
		}
		return trace.Wrap(err)
	}
	return trace.ConnectionProblem(nil, "backend schema: the version item kept changing while migrating")
}

func (m Migrator) run(ctx context.Context, b backend.Backend) error {
	rec, item, err := Read(ctx, b)
	if err != nil {
		return trace.Wrap(err)
	}
	if item == nil {
		some, err := b.GetRange(ctx, backend.Separator, 1)
		if err != nil {
			return trace.Wrap(err)
		}
		if len(some) == 0 {
			// A new backend is born at the current version.
			_, err := b.Create(ctx, m.encode(Record{Version: m.Current}))
			return trace.Wrap(err)
		}
	}
	if err := CheckVersion(rec.Version, m.Current); err != nil {
		return trace.Wrap(err)
	}
	for _, s := range m.Steps[rec.Version:] {
		log := m.Logger.WithFields(logrus.Fields{"from": s.To - 1, "to": s.To, "step": s.Name})
		log.Info("Migrating the backend.")
		if err := s.Apply(ctx, b); err != nil {
			return trace.Wrap(err, "migrating the backend to schema version %d (%s)", s.To, s.Name)
		}
		next := Record{Version: s.To, Applied: append(append([]Applied(nil), rec.Applied...), Applied{
			To: s.To, Name: s.Name, Postern: version.Version, At: b.Clock().Now().UTC(),
		})}
		var stored *backend.Item
		if item == nil {
			stored, err = b.Create(ctx, m.encode(next))
		} else {
			stored, err = b.CompareAndSwap(ctx, *item, m.encode(next))
		}
		if err != nil {
			return trace.Wrap(err)
		}
		rec, item = next, stored
	}
	return nil
}

func (m Migrator) encode(rec Record) backend.Item {
	data, _ := json.Marshal(rec) // plain struct: cannot fail
	return backend.Item{Key: Key, Value: data}
}
