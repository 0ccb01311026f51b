package services

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/gravitational/trace"
	"gopkg.in/yaml.v3"
)

// maxResourceFileSize bounds what `pctl create -f` reads. A role or a
// networking config is a few hundred bytes; a megabyte is a mistake (or a
// YAML bomb), not a resource.
const maxResourceFileSize = 1 << 20

// resourceKinds are the kinds a resource file may contain, with the Go type
// each decodes into. Users, nodes, tokens and CAs have their own commands
// (they carry secrets or are written by machines), so they are not here.
var resourceKinds = map[string]reflect.Type{
	KindRole:              reflect.TypeFor[Role](),
	KindClusterNetworking: reflect.TypeFor[ClusterNetworkingConfig](),
	KindTrustedCluster:    reflect.TypeFor[TrustedCluster](),
	KindOIDCConnector:     reflect.TypeFor[OIDCConnector](),
	KindAuthPreference:    reflect.TypeFor[AuthPreference](),
}

// UnmarshalResource decodes one resource from a YAML or JSON file (JSON is
// YAML, so one parser serves both) for `pctl create -f`. It returns the
// kind and a validated pointer (*Role, *ClusterNetworkingConfig,
// *TrustedCluster, *OIDCConnector or *AuthPreference).
//
// YAML is decoded into a yaml.Node first, checked key by key against the Go
// type (so an unknown or mistyped key is reported as "FILE:LINE: ..." with
// the line it is on: a typo like `forward_agnet: true` must fail loudly,
// never be silently ignored and leave forwarding off), then converted to
// JSON and decoded with DisallowUnknownFields, the same path the backend's
// JSON takes, so a file means exactly what is stored.
func UnmarshalResource(data []byte, filename string) (kind string, v any, err error) {
	if filename == "" {
		filename = "<input>"
	}
	if len(data) > maxResourceFileSize {
		return "", nil, trace.BadParameter("%s: file is larger than %d bytes", filename, maxResourceFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return "", nil, trace.BadParameter("%s: empty file: want a resource with a kind", filename)
		}
		return "", nil, trace.BadParameter("%s: %v", filename, yamlErrorText(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		if len(extra.Content) > 0 {
			line = extra.Content[0].Line
		}
		if err != nil {
			return "", nil, trace.BadParameter("%s: %v", filename, yamlErrorText(err))
		}
		return "", nil, trace.BadParameter("%s:%d: a second document: put one resource per file", filename, line)
	}
	p := &resourceParser{file: filename}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) != 1 {
			return "", nil, trace.BadParameter("%s: empty document: want a resource with a kind", filename)
		}
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return "", nil, p.errorf(root, "want a mapping with kind, version, metadata and spec, got %s", describeNode(root))
	}
	kindNode := mappingValue(root, "kind")
	if kindNode == nil {
		return "", nil, p.errorf(root, "missing \"kind\": want one of %s", supportedKinds())
	}
	if kindNode.Kind != yaml.ScalarNode {
		return "", nil, p.errorf(kindNode, "kind: want a string, got %s", describeNode(kindNode))
	}
	kind = kindNode.Value
	t, ok := resourceKinds[kind]
	if !ok {
		return "", nil, p.errorf(kindNode, "unsupported kind %q: want one of %s", kind, supportedKinds())
	}
	if err := p.check(root, t, ""); err != nil {
		return "", nil, trace.Wrap(err)
	}
	js, err := json.Marshal(p.toValue(root))
	if err != nil {
		return "", nil, trace.BadParameter("%s: %v", filename, err)
	}
	ptr := reflect.New(t)
	jd := json.NewDecoder(bytes.NewReader(js))
	jd.DisallowUnknownFields()
	if err := jd.Decode(ptr.Interface()); err != nil {
		// check() should have caught anything the JSON decoder rejects;
		// this is the backstop, without a line number.
		return "", nil, trace.BadParameter("%s: %v", filename, err)
	}
	v = ptr.Interface()
	if c, ok := v.(interface{ CheckAndSetDefaults() error }); ok {
		if err := c.CheckAndSetDefaults(); err != nil {
			return "", nil, trace.BadParameter("%s: %v", filename, trace.UserMessage(err))
		}
	}
	return kind, v, nil
}

func supportedKinds() string {
	return fmt.Sprintf("%q, %q, %q, %q or %q", KindRole, KindClusterNetworking, KindTrustedCluster, KindOIDCConnector, KindAuthPreference)
}

// yamlErrorText strips the "yaml: " prefix: the file name replaces it.
func yamlErrorText(err error) string {
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

type resourceParser struct {
	file string
}

func (p *resourceParser) errorf(n *yaml.Node, format string, args ...any) error {
	return trace.BadParameter("%s:%d: %s", p.file, n.Line, fmt.Sprintf(format, args...))
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()
)

// hasCustomDecoding reports whether t decodes itself (Duration, time.Time,
// LabelValues); such values are checked as leaves.
func hasCustomDecoding(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return pt.Implements(jsonUnmarshalerType) || pt.Implements(textUnmarshalerType)
}

// check walks n alongside t and reports the first unknown key, wrong shape
// or bad value with the line it is on. path is the dotted JSON path.
func (p *resourceParser) check(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		// Anchors and aliases buy nothing in a one-resource file and are
		// how YAML bombs are built.
		return p.errorf(n, "%sYAML anchors and aliases are not supported", pathPrefix(path))
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		// null is the zero value, as in JSON.
		return nil
	}
	switch {
	case hasCustomDecoding(t):
		return p.checkLeaf(n, t, path)
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return p.errorf(n, "%swant a mapping, got %s", pathPrefix(path), describeNode(n))
		}
		fields := jsonFields(t)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return p.errorf(k, "%swant a string key, got %s", pathPrefix(path), describeNode(k))
			}
			f, ok := fields[k.Value]
			if !ok {
				return p.errorf(k, "unknown field %q in %s: known fields are %s", k.Value, pathName(path), strings.Join(fieldNames(t), ", "))
			}
			if seen[k.Value] {
				return p.errorf(k, "duplicate field %q in %s", k.Value, pathName(path))
			}
			seen[k.Value] = true
			if err := p.check(val, f.Type, joinPath(path, k.Value)); err != nil {
				return err
			}
		}
		return nil
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String:
		if n.Kind != yaml.MappingNode {
			return p.errorf(n, "%swant a mapping, got %s", pathPrefix(path), describeNode(n))
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return p.errorf(k, "%swant a string key, got %s", pathPrefix(path), describeNode(k))
			}
			if seen[k.Value] {
				return p.errorf(k, "duplicate key %q in %s", k.Value, pathName(path))
			}
			seen[k.Value] = true
			if err := p.check(val, t.Elem(), joinPath(path, k.Value)); err != nil {
				return err
			}
		}
		return nil
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		if n.Kind != yaml.SequenceNode {
			return p.errorf(n, "%swant a list, got %s", pathPrefix(path), describeNode(n))
		}
		for i, el := range n.Content {
			if err := p.check(el, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	return p.checkLeaf(n, t, path)
}

// checkLeaf decodes one value on its own through JSON, so a type error
// (`forward_agent: "maybe"`, `max_session_ttl: 12 hours`) is reported on the
// line of that value.
func (p *resourceParser) checkLeaf(n *yaml.Node, t reflect.Type, path string) error {
	if err := p.checkNoAliases(n, path); err != nil {
		return err
	}
	js, err := json.Marshal(p.toValue(n))
	if err != nil {
		return p.errorf(n, "%s%v", pathPrefix(path), err)
	}
	if err := json.Unmarshal(js, reflect.New(t).Interface()); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return p.errorf(n, "%swant %s, got %s", pathPrefix(path), describeType(t), describeNode(n))
		}
		return p.errorf(n, "%s%v", pathPrefix(path), trace.UserMessage(err))
	}
	return nil
}

func (p *resourceParser) checkNoAliases(n *yaml.Node, path string) error {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return p.errorf(n, "%sYAML anchors and aliases are not supported", pathPrefix(path))
	}
	for _, c := range n.Content {
		if err := p.checkNoAliases(c, path); err != nil {
			return err
		}
	}
	return nil
}

// toValue converts a checked yaml.Node into the any-tree json.Marshal
// understands. Scalars keep their YAML 1.2 types (true, 12, "12h").
func (p *resourceParser) toValue(n *yaml.Node) any {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return p.toValue(n.Content[0])
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			m[n.Content[i].Value] = p.toValue(n.Content[i+1])
		}
		return m
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			s = append(s, p.toValue(c))
		}
		return s
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return n.Value
		}
		switch x := v.(type) {
		case string, bool, int, int64, uint64, nil:
			return x
		case float64:
			// NaN and infinities have no JSON form; hand them on as text
			// so the leaf check reports a type error instead of failing
			// in json.Marshal.
			js, err := json.Marshal(x)
			if err != nil {
				return n.Value
			}
			return json.RawMessage(js)
		default:
			// Timestamps and other YAML-only types: their text, which is
			// what time.Time's JSON decoding wants anyway.
			return n.Value
		}
	}
	return nil
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

func fieldNames(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.IsExported() && name != "-" && name != "" {
			out = append(out, name)
		}
	}
	return out
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func pathPrefix(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}

func pathName(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		switch n.Tag {
		case "!!str":
			return fmt.Sprintf("the string %q", v)
		case "!!null":
			return "null"
		}
		return fmt.Sprintf("%s %s", strings.TrimPrefix(n.Tag, "!!"), v)
	}
	return "nothing"
}

func describeType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[Duration]():
		return `a duration like "12h" or "30s"`
	case reflect.TypeFor[LabelValues]():
		return "a string or a list of strings"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32:
		return "an integer"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

// MarshalResourceYAML renders a resource (or a list of them) as YAML with
// the same field names as the stored JSON, for `pctl get`. It goes through
// JSON so that what is printed is exactly what UnmarshalResource accepts
// and what the backend holds (Duration as "12h0m0s", omitempty honoured).
func MarshalResourceYAML(v any) ([]byte, error) {
	js, err := json.Marshal(v)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(js, &n); err != nil {
		return nil, trace.Wrap(err)
	}
	blockStyle(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := enc.Close(); err != nil {
		return nil, trace.Wrap(err)
	}
	return buf.Bytes(), nil
}

// blockStyle turns the flow style JSON parses into ({...}, "...") into
// plain block YAML; the encoder still quotes strings that would otherwise
// read back as another type ("true", "12").
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}
