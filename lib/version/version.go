// Package version holds the build's version, stamped by the Makefile with
// -ldflags so that every binary and every node record tells what it runs.
package version

// Version is overwritten at link time; "dev" marks a plain `go build`.
var Version = "dev"
