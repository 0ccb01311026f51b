package services

// Names of the roles every cluster is created with.
const (
	// PresetAccessRole is the default role of a new user: their own logins
	// on every node, with agent and port forwarding.
	PresetAccessRole = "access"
	// PresetAdminRole manages the cluster through pctl, and reaches nodes
	// like access does so that an admin is never locked out of the fleet
	// they administer.
	PresetAdminRole = "admin"
)

// PresetRoles returns fresh copies of the preset roles, validated and with
// defaults set. The auth server writes them on first start; callers may
// modify the returned values.
func PresetRoles() []*Role {
	access := &Role{
		Metadata: Metadata{Name: PresetAccessRole, Description: "Log in to every node with your own logins."},
		Spec: RoleSpec{
			Logins:         []string{loginsTemplate},
			NodeLabels:     map[string]LabelValues{Wildcard: {Wildcard}},
			ForwardAgent:   true,
			PortForwarding: true,
		},
	}
	admin := &Role{
		Metadata: Metadata{Name: PresetAdminRole, Description: "Manage the cluster with pctl, and reach every node."},
		Spec: RoleSpec{
			Logins:         []string{loginsTemplate},
			NodeLabels:     map[string]LabelValues{Wildcard: {Wildcard}},
			ForwardAgent:   true,
			PortForwarding: true,
			Admin:          true,
		},
	}
	roles := []*Role{access, admin}
	for _, r := range roles {
		if err := r.CheckAndSetDefaults(); err != nil {
			// The presets are constants of this package; a failure is a
			// programming error caught by the package tests.
			panic(err)
		}
	}
	return roles
}
