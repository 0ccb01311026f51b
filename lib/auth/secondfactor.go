package auth

import (
	"context"
	"net/http"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

// ClusterSecondFactor is the cluster-wide second-factor hint the proxy's
// /webapi/ping gives psh and the web login page: the auth_preference's
// second_factor when one is set; otherwise "otp" when any user has a TOTP
// device. It is
// cluster-wide because a per-user answer would tell an anonymous caller
// who has OTP; psh then asks for a code and users without one leave it
// empty (auth ignores the code for them). Auth computes it because only
// auth sees the secrets: every proxy, in this process or not, asks here.
func (s *Server) ClusterSecondFactor(ctx context.Context) (string, error) {
	pref, err := s.authPreference(ctx)
	if err != nil {
		return "", trace.Wrap(err)
	}
	if pref != nil {
		return pref.Spec.SecondFactor, nil
	}
	hasTOTP, err := s.store.HasMFADevice(ctx, services.MFAKindTOTP)
	if err != nil {
		return "", trace.Wrap(err)
	}
	if hasTOTP {
		return webapi.SecondFactorOTP, nil
	}
	users, err := s.store.GetUsers(ctx)
	if err != nil {
		return "", trace.Wrap(err)
	}
	for _, u := range users {
		if u.TOTPSecret != "" {
			return webapi.SecondFactorOTP, nil
		}
	}
	return webapi.SecondFactorOff, nil
}

func (a *APIServer) getSecondFactor(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	sf, err := a.auth.ClusterSecondFactor(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return authapi.SecondFactorResponse{SecondFactor: sf}, nil
}

// ClusterSecondFactor asks auth for the cluster's second-factor hint.
func (c *Client) ClusterSecondFactor(ctx context.Context) (string, error) {
	var out authapi.SecondFactorResponse
	if err := c.do(ctx, http.MethodGet, "/v1/second-factor", nil, nil, &out); err != nil {
		return "", trace.Wrap(err)
	}
	return out.SecondFactor, nil
}
