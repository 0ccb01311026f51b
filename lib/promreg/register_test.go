package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestRegisterSharesTheExistingCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	first, err := Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	second, err := Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	require.Same(t, first, second, "the second registration gets the first collector")

	// Same name, another type: an error, not a silent mix-up.
	_, err = Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "x"}))
	require.Error(t, err)
}
