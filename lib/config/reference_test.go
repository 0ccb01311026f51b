package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/postern-dev/postern/lib/refdoc"
)

// yamlKeys lists the dotted key paths of a config struct as the YAML file
// spells them (limits.max_descriptors), nested structs included.
func yamlKeys(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" {
			out = append(out, yamlKeys(ft, prefix)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		key := prefix + name
		out = append(out, key)
		if ft.Kind() == reflect.Struct && ft.PkgPath() == reflect.TypeOf(FileConfig{}).PkgPath() {
			out = append(out, yamlKeys(ft, key+".")...)
		}
	}
	return out
}

// TestReferenceDocumentsEveryKey fails when postern.yaml gains a key that
// docs/reference.md does not describe: every key of FileConfig, by its
// dotted path, in the daemon's config section.
func TestReferenceDocumentsEveryKey(t *testing.T) {
	keys := yamlKeys(reflect.TypeOf(FileConfig{}), "")
	// The walk itself must see the nested keys, or the test proves nothing.
	for _, k := range []string{"data_dir", "backend.etcd_tls.ca_file", "limits.max_descriptors"} {
		if !slices.Contains(keys, k) {
			t.Fatalf("yamlKeys missed %s: %v", k, keys)
		}
	}
	refdoc.Load(t).Section(t, "Config file (`postern.yaml`)").RequireCode(t, "postern.yaml keys", keys...)
}
