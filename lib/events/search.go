package events

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// DefaultSearchLimit bounds a search whose limit is zero or negative: a
// month of a busy cluster's events is far more than a terminal shows or a
// response should carry.
const DefaultSearchLimit = 1000

// keyPrefix is where events live in the backend.
const keyPrefix = "events"

// dayLayout names a day's bucket. Keys are /events/DAY/NANOS-ID: a search
// reads whole days (prefix ranges are all a backend offers), newest first,
// and within a day the zero-padded nanoseconds sort in time order.
const dayLayout = "2006-01-02"

func eventKey(e Event) string {
	t := e.Time.UTC()
	return backend.Key(keyPrefix, t.Format(dayLayout), fmt.Sprintf("%019d-%s", t.UnixNano(), e.ID))
}

// Search returns events at or after since (zero means the whole TTL), of
// eventType (empty means every type), oldest first. When more than limit
// match, the most recent limit are returned. It reads the backend when
// there is one, otherwise the file.
func (l *Log) Search(ctx context.Context, since time.Time, eventType string, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = DefaultSearchLimit
	}
	now := l.cfg.Clock.Now().UTC()
	oldest := now.Add(-l.cfg.TTL)
	if since.Before(oldest) {
		since = oldest
	}
	match := func(e *Event) bool {
		return !e.Time.Before(since) && (eventType == "" || e.Type == eventType)
	}
	if l.cfg.Backend == nil {
		return l.searchFile(match, limit)
	}
	// Newest day first, newest event first, until limit: then reverse.
	var out []Event
	startDay := truncateDay(since)
	for day := truncateDay(now); !day.Before(startDay); day = day.AddDate(0, 0, -1) {
		items, err := l.cfg.Backend.GetRange(ctx, backend.Prefix(keyPrefix, day.Format(dayLayout)), 0)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		for i := len(items) - 1; i >= 0; i-- {
			var e Event
			if err := e.UnmarshalJSON(items[i].Value); err != nil {
				l.log.WithError(err).WithField("key", items[i].Key).Warn("Skipping a malformed audit event.")
				continue
			}
			if match(&e) {
				out = append(out, e)
				if len(out) == limit {
					reverse(out)
					return out, nil
				}
			}
		}
	}
	reverse(out)
	return out, nil
}

// searchFile scans events.log, keeping the last limit matches.
func (l *Log) searchFile(match func(*Event) bool, limit int) ([]Event, error) {
	f, err := os.Open(filepath.Join(l.cfg.Dir, FileName))
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	defer f.Close()
	ring := make([]Event, 0, limit)
	start := 0
	sc := bufio.NewScanner(f)
	// A line holds at most a few fields of maxStringField each.
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var e Event
		if err := e.UnmarshalJSON(sc.Bytes()); err != nil || !match(&e) {
			continue
		}
		if len(ring) < limit {
			ring = append(ring, e)
			continue
		}
		ring[start] = e
		start = (start + 1) % limit
	}
	if err := sc.Err(); err != nil {
		return nil, trace.Wrap(err)
	}
	return append(ring[start:], ring[:start]...), nil
}

func truncateDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

func reverse(es []Event) {
	for i, j := 0, len(es)-1; i < j; i, j = i+1, j-1 {
		es[i], es[j] = es[j], es[i]
	}
}
