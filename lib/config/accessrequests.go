package config

import (
	"path/filepath"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events/export"
)

// AccessRequestsConfig is the auth server's access_requests section: where
// to tell people that a request changed state (a chat bridge, a ticketing
// system), so reviewers need not watch pctl requests ls.
type AccessRequestsConfig struct {
	// Webhook, when set, gets a JSON line per state change POSTed to it
	// (batched, retried with backoff, never blocking a request).
	Webhook string `yaml:"webhook,omitempty"`
	// CAFile verifies the webhook's certificate instead of the system's
	// roots.
	CAFile string `yaml:"ca_file,omitempty"`
}

// check validates the section, naming the key at fault.
func (a *AccessRequestsConfig) check() error {
	if a.Webhook != "" {
		if _, err := export.CheckURL(a.Webhook); err != nil {
			return trace.BadParameter("access_requests.webhook %v", err)
		}
	}
	if a.CAFile != "" {
		if a.Webhook == "" {
			return trace.BadParameter("access_requests.ca_file is for the webhook: set access_requests.webhook too")
		}
		abs, err := filepath.Abs(a.CAFile)
		if err != nil {
			return trace.BadParameter("access_requests.ca_file %q: %v", a.CAFile, err)
		}
		a.CAFile = abs
	}
	return nil
}

// ExportConfig is the webhook's lib/events/export configuration.
func (a *AccessRequestsConfig) ExportConfig() export.Config {
	return export.Config{Webhook: a.Webhook, CAFile: a.CAFile}
}
