package services

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// jsonPaths lists the dotted field paths of a resource as pctl get shows
// them and pctl create -f reads them (spec.node_address_networks),
// descending into this package's structs, in slices too (spec.role_map.remote).
func jsonPaths(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		out = append(out, prefix+name)
		if ft.Kind() == reflect.Struct && ft.PkgPath() == reflect.TypeOf(Role{}).PkgPath() {
			out = append(out, jsonPaths(ft, prefix+name+".")...)
		}
	}
	return out
}

// TestReferenceDocumentsEveryResourceField fails when a resource kind that
// pctl shows or accepts gains a field docs/reference.md does not describe
// in that kind's section.
func TestReferenceDocumentsEveryResourceField(t *testing.T) {
	kinds := map[string]any{
		KindRole:              Role{},
		KindClusterNetworking: ClusterNetworkingConfig{},
		KindTrustedCluster:    TrustedCluster{},
		KindUser:              User{},
		KindNode:              Node{},
		KindLock:              Lock{},
		KindProxy:             Proxy{},
		KindToken:             Token{},
		KindRemoteCluster:     RemoteCluster{},
		KindOIDCConnector:     OIDCConnector{},
		KindAuthPreference:    AuthPreference{},
	}
	require.Contains(t, jsonPaths(reflect.TypeOf(ClusterNetworkingConfig{}), ""), "spec.node_address_networks")
	require.Contains(t, jsonPaths(reflect.TypeOf(TrustedCluster{}), ""), "spec.role_map.remote")
	doc := refdoc.Load(t).Section(t, "Resources")
	for kind, v := range kinds {
		doc.Section(t, "`"+kind+"`").RequireCode(t, kind+" fields", jsonPaths(reflect.TypeOf(v), "")...)
	}
}
