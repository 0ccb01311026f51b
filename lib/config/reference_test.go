package config

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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

// TestReferenceDocumentsTheDataDir fails when the data dir gains a path
// (a Config method NamePath or NameDir) that the reference's data dir
// section does not list, as itself or as the directory of a listed file.
func TestReferenceDocumentsTheDataDir(t *testing.T) {
	cfg := &Config{FileConfig: FileConfig{DataDir: "/data"}}
	v := reflect.ValueOf(cfg)
	var paths []string
	for i := 0; i < v.NumMethod(); i++ {
		m, name := v.Method(i), v.Type().Method(i).Name
		if !strings.HasSuffix(name, "Path") && !strings.HasSuffix(name, "Dir") {
			continue
		}
		if m.Type().NumIn() != 0 || m.Type().NumOut() != 1 || m.Type().Out(0).Kind() != reflect.String {
			continue
		}
		rel, err := filepath.Rel(cfg.DataDir, m.Call(nil)[0].String())
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			continue
		}
		paths = append(paths, rel)
	}
	for _, role := range []string{RoleNode, RoleProxy} {
		paths = append(paths, strings.TrimPrefix(cfg.IdentityDir(role), cfg.DataDir+"/"))
	}
	require.Contains(t, paths, filepath.Join("backend", "postern.db"))
	spans := refdoc.Load(t).Section(t, "Files in the data dir").Spans()
	for _, p := range paths {
		if !slices.ContainsFunc(spans, func(s string) bool { return s == p || strings.HasPrefix(s, p+"/") }) {
			t.Errorf("docs/reference.md's data dir section does not list %s (as `%s` or `%s/...`)", p, p, p)
		}
	}
}
