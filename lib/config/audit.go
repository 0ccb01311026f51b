package config

import (
	"path/filepath"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events/export"
)

// AuditConfig sends a copy of the audit events this process emits where
// the operator keeps logs (audit: in postern.yaml); lib/events/export
// describes both. events.log in the data dir is written either way.
type AuditConfig struct {
	// File, when set, gets every event appended as a JSON line.
	File string `yaml:"file,omitempty"`
	// Format of both; only json (the default) for now, named so that a
	// second format does not change what an existing config means.
	Format string `yaml:"format,omitempty"`
	// Webhook, when set, gets batches of JSON lines POSTed to it.
	Webhook string `yaml:"webhook,omitempty"`
	// CAFile verifies the webhook's certificate instead of the system's
	// roots.
	CAFile string `yaml:"ca_file,omitempty"`
	// MaxSizeBytes, when set, rotates File once it reaches that size,
	// keeping MaxFiles rotated files (FILE.1 the newest).
	MaxSizeBytes int64 `yaml:"max_size_bytes,omitempty"`
	// MaxFiles is how many rotated files are kept; zero means
	// export.DefaultMaxFiles.
	MaxFiles int `yaml:"max_files,omitempty"`
}

// AuditFormatJSON is the one export format.
const AuditFormatJSON = "json"

// check validates the audit section, naming the key at fault, and makes
// the paths absolute (the daemon may change directory).
func (a *AuditConfig) check() error {
	switch a.Format {
	case "":
		a.Format = AuditFormatJSON
	case AuditFormatJSON:
	default:
		return trace.BadParameter("audit.format %q: want json", a.Format)
	}
	if a.File != "" {
		abs, err := filepath.Abs(a.File)
		if err != nil {
			return trace.BadParameter("audit.file %q: %v", a.File, err)
		}
		a.File = abs
	}
	if a.MaxSizeBytes < 0 || a.MaxFiles < 0 {
		return trace.BadParameter("audit.max_size_bytes and audit.max_files must not be negative")
	}
	if (a.MaxSizeBytes > 0 || a.MaxFiles > 0) && a.File == "" {
		return trace.BadParameter("audit.max_size_bytes and audit.max_files rotate audit.file: set audit.file too")
	}
	if a.MaxFiles > 0 && a.MaxSizeBytes == 0 {
		return trace.BadParameter("audit.max_files keeps files rotated by size: set audit.max_size_bytes too")
	}
	if a.Webhook != "" {
		if _, err := export.CheckURL(a.Webhook); err != nil {
			return trace.BadParameter("audit.webhook %v", err)
		}
	}
	if a.CAFile != "" {
		if a.Webhook == "" {
			return trace.BadParameter("audit.ca_file is for the webhook: set audit.webhook too")
		}
		abs, err := filepath.Abs(a.CAFile)
		if err != nil {
			return trace.BadParameter("audit.ca_file %q: %v", a.CAFile, err)
		}
		a.CAFile = abs
	}
	return nil
}

// ExportConfig is what lib/events/export needs of the audit section.
func (a *AuditConfig) ExportConfig() export.Config {
	return export.Config{File: a.File, Webhook: a.Webhook, CAFile: a.CAFile, MaxSizeBytes: a.MaxSizeBytes, MaxFiles: a.MaxFiles}
}
