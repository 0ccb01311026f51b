package authz

// CanViewRecording decides whether id may list or play the recording of a
// session run by owner: users see their own, a role with
// review_recordings sees all, and nothing else is granted. Everything
// refused must look to the caller exactly like a recording that does not
// exist: never reveal what the caller's roles do not let them see.
func (id *Identity) CanViewRecording(owner string) bool {
	if id == nil || id.User == "" {
		return false
	}
	if owner == id.User {
		return true
	}
	return id.Checker != nil && id.Checker.ReviewRecordings()
}
