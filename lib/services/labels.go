package services

import (
	"bytes"
	"encoding/json"

	"github.com/gravitational/trace"
	"gopkg.in/yaml.v3"
)

// UnmarshalJSON accepts one string ("prod") or a list (["prod","staging"]):
// operators write `env: prod` far more often than a one-element list, and
// both must mean the same thing.
func (l *LabelValues) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return trace.BadParameter("label value: %v", err)
		}
		*l = LabelValues{s}
		return nil
	}
	var list []string
	if err := json.Unmarshal(data, &list); err != nil {
		return trace.BadParameter("label values: want a string or a list of strings, got %s", truncate(data, 40))
	}
	*l = list
	return nil
}

// UnmarshalYAML is the YAML twin of UnmarshalJSON, for callers that decode
// YAML straight into the struct (UnmarshalResource goes through JSON).
func (l *LabelValues) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var s string
		if err := n.Decode(&s); err != nil {
			return trace.BadParameter("line %d: label value: %v", n.Line, err)
		}
		*l = LabelValues{s}
		return nil
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			return trace.BadParameter("line %d: label values: %v", n.Line, err)
		}
		*l = list
		return nil
	}
	return trace.BadParameter("line %d: label values: want a string or a list of strings", n.Line)
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}
