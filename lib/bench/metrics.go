package bench

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
)

// metricsTimeout bounds one scrape: the diagnostics port is local and
// answers in milliseconds, a hung one must not hold the report.
const metricsTimeout = 10 * time.Second

// MetricsSampler reads process_resident_memory_bytes and go_goroutines
// (the Prometheus process and Go collectors) from a /metrics URL, such as
// a Postern proxy's diagnostics address.
func MetricsSampler(url string) func(ctx context.Context) (Sample, error) {
	hc := &http.Client{Timeout: metricsTimeout}
	return func(ctx context.Context) (Sample, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return Sample{}, trace.BadParameter("--metrics-url %q: %v", url, err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return Sample{}, trace.ConnectionProblem(err, "reading %s: %v", url, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return Sample{}, trace.ConnectionProblem(nil, "reading %s: HTTP %d", url, resp.StatusCode)
		}
		var s Sample
		var haveRSS, haveG bool
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			name, val, ok := strings.Cut(sc.Text(), " ")
			if !ok {
				continue
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				continue
			}
			switch name {
			case "process_resident_memory_bytes":
				s.RSS, haveRSS = int64(f), true
			case "go_goroutines":
				s.Goroutines, haveG = int64(f), true
			}
		}
		if err := sc.Err(); err != nil {
			return Sample{}, trace.ConnectionProblem(err, "reading %s: %v", url, err)
		}
		if !haveRSS || !haveG {
			return Sample{}, trace.NotFound("%s has no process_resident_memory_bytes or go_goroutines: is it a Postern diagnostics address?", url)
		}
		return s, nil
	}
}
