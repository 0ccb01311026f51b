package auth

import (
	"context"
	"net/http"
	"net/url"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// The auth API of second factors and auth_preference: the handlers (their
// roles are in registerRoutes) and the client's side of each.

func (a *APIServer) getAuthPreference(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	pref, err := a.auth.store.GetAuthPreference(ctx)
	return pref, trace.Wrap(err)
}

func (a *APIServer) setAuthPreference(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var pref services.AuthPreference
	if err := readJSON(r, &pref); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := a.auth.store.SetAuthPreference(ctx, &pref); err != nil {
		return nil, trace.Wrap(err)
	}
	a.log.WithFields(map[string]any{"second_factor": pref.Spec.SecondFactor, "passwordless": pref.Spec.Passwordless, "by": p.ID}).Info("Set the auth preference.")
	return nil, nil
}

func (a *APIServer) deleteAuthPreference(ctx context.Context, p *peer, _ *http.Request) (any, error) {
	if err := a.auth.store.DeleteAuthPreference(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	a.log.WithField("by", p.ID).Info("Removed the auth preference.")
	return nil, nil
}

func (a *APIServer) resetMFA(ctx context.Context, p *peer, r *http.Request) (any, error) {
	n, err := a.auth.ResetMFA(ctx, r.PathValue("name"), p.ID)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return authapi.ResetMFAResponse{Removed: n}, nil
}

func (a *APIServer) mfaRegisterBegin(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.MFARegisterBeginRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.BeginWebAuthnRegistration(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) mfaRegisterFinish(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.MFAFinishRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.FinishWebAuthnRegistration(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) mfaLoginBegin(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.MFALoginBeginRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.BeginWebAuthnLogin(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) mfaLoginFinish(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.MFALoginFinishRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.FinishWebAuthnLogin(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) mfaListDevices(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.ListMFADevices(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) mfaRenameDevice(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.MFADeviceRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.RenameMFADevice(ctx, req))
}

func (a *APIServer) mfaDeleteDevice(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.MFADeviceRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.DeleteMFADevice(ctx, req))
}

// GetAuthPreference reads the auth_preference; NotFound when none is set.
func (c *Client) GetAuthPreference(ctx context.Context) (*services.AuthPreference, error) {
	return call[services.AuthPreference](ctx, c, http.MethodGet, "/v1/auth_preference", nil, nil)
}

// SetAuthPreference writes the auth_preference (admin).
func (c *Client) SetAuthPreference(ctx context.Context, pref *services.AuthPreference) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/auth_preference", nil, pref, nil))
}

// DeleteAuthPreference removes the auth_preference (admin).
func (c *Client) DeleteAuthPreference(ctx context.Context) error {
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/auth_preference", nil, nil, nil))
}

// ResetMFA removes every second factor of a user (admin); see
// Server.ResetMFA.
func (c *Client) ResetMFA(ctx context.Context, name string) (int, error) {
	resp, err := call[authapi.ResetMFAResponse](ctx, c, http.MethodDelete, "/v1/users/"+url.PathEscape(name)+"/mfa", nil, nil)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	return resp.Removed, nil
}

// BeginWebAuthnRegistration starts adding a passkey; see the Server's.
func (c *Client) BeginWebAuthnRegistration(ctx context.Context, req authapi.MFARegisterBeginRequest) (*authapi.MFAChallenge, error) {
	return call[authapi.MFAChallenge](ctx, c, http.MethodPost, "/v1/mfa/register/begin", nil, req)
}

// FinishWebAuthnRegistration stores a new passkey; see the Server's.
func (c *Client) FinishWebAuthnRegistration(ctx context.Context, req authapi.MFAFinishRequest) (*authapi.MFADevice, error) {
	return call[authapi.MFADevice](ctx, c, http.MethodPost, "/v1/mfa/register/finish", nil, req)
}

// BeginWebAuthnLogin starts a passkey login; see the Server's.
func (c *Client) BeginWebAuthnLogin(ctx context.Context, req authapi.MFALoginBeginRequest) (*authapi.MFAChallenge, error) {
	return call[authapi.MFAChallenge](ctx, c, http.MethodPost, "/v1/mfa/login/begin", nil, req)
}

// FinishWebAuthnLogin finishes a passkey login; see the Server's.
func (c *Client) FinishWebAuthnLogin(ctx context.Context, req authapi.MFALoginFinishRequest) (*authapi.SSHLoginResponse, error) {
	return call[authapi.SSHLoginResponse](ctx, c, http.MethodPost, "/v1/mfa/login/finish", nil, req)
}

// ListMFADevices lists a web session user's devices.
func (c *Client) ListMFADevices(ctx context.Context, ref authapi.WebSessionRequest) ([]authapi.MFADevice, error) {
	var out []authapi.MFADevice
	return out, trace.Wrap(c.do(ctx, http.MethodPost, "/v1/mfa/devices/list", nil, ref, &out))
}

// RenameMFADevice renames one of a web session user's devices.
func (c *Client) RenameMFADevice(ctx context.Context, req authapi.MFADeviceRequest) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/mfa/devices/rename", nil, req, nil))
}

// DeleteMFADevice removes one of a web session user's devices.
func (c *Client) DeleteMFADevice(ctx context.Context, req authapi.MFADeviceRequest) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/mfa/devices/delete", nil, req, nil))
}
