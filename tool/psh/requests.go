package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/services"
)

// requestPollInterval is how often --wait asks whether a request was
// reviewed: a reviewer's click shows within seconds, and a waiting psh
// costs the proxy one small subsystem call each time.
const requestPollInterval = 2 * time.Second

// requestFlags are the flags of psh request and of psh login
// --request-id.
type requestFlags struct {
	roles       []string
	reason, id  string
	format      string
	ttl         time.Duration
	wait        bool
	waitTimeout time.Duration
	loginID     string
	loginWait   bool
}

func (c *cli) addRequests(app *kingpin.Application, add func(*kingpin.CmdClause, func(context.Context) error), login *kingpin.CmdClause, doLogin func(context.Context) error) {
	f := &c.req
	login.Flag("request-id", "Re-issue the current certificate with the roles of this approved access request (until the request expires).").StringVar(&f.loginID)
	login.Flag("wait", "With --request-id: wait until the request is reviewed first.").BoolVar(&f.loginWait)
	add(login, func(ctx context.Context) error {
		if f.loginID != "" {
			if c.login.user != "" || c.login.auth != "" {
				return trace.BadParameter("--request-id re-issues your current certificate: it takes no --user or --auth (psh login first, then psh login --request-id)")
			}
			return c.doRequestLogin(ctx, f.loginID, f.loginWait)
		}
		if f.loginWait {
			return trace.BadParameter("--wait is for --request-id")
		}
		if c.login.proxy == "" {
			return trace.BadParameter("required flag --proxy not provided (see psh --help)")
		}
		return doLogin(ctx)
	})

	req := app.Command("request", "Just-in-time access requests: ask for a role, have it reviewed, log in with it.")
	create := req.Command("create", "Request roles; prints the request id.")
	create.Flag("roles", "Roles to request (comma-separated or repeated); your roles' request option must name them.").Required().StringsVar(&f.roles)
	create.Flag("reason", "Why, for the reviewers.").StringVar(&f.reason)
	create.Flag("ttl", "How long the grant should last (capped by the request option's max_ttl; default the cap).").DurationVar(&f.ttl)
	create.Flag("wait", "Wait until the request is reviewed; once approved, re-issue the certificate with its roles.").BoolVar(&f.wait)
	create.Flag("wait-timeout", "Give up waiting after this long.").Default("1h").DurationVar(&f.waitTimeout)
	add(create, c.doRequestCreate)

	ls := req.Command("ls", "List your requests and those you may review.")
	ls.Flag("format", "Output format: text or json.").Default("text").EnumVar(&f.format, "text", "json")
	add(ls, c.doRequestLs)

	show := req.Command("show", "Show one request and its reviews.")
	show.Flag("format", "Output format: text or json.").Default("text").EnumVar(&f.format, "text", "json")
	show.Arg("id", "Request id.").Required().StringVar(&f.id)
	add(show, c.doRequestShow)

	for _, verdict := range []string{"approve", "deny"} {
		state := services.RequestApproved
		if verdict == "deny" {
			state = services.RequestDenied
		}
		cc := req.Command(verdict, strings.ToUpper(verdict[:1])+verdict[1:]+" another user's request (your roles' review_requests must name its roles).")
		cc.Flag("reason", "Why, for the requester.").StringVar(&f.reason)
		cc.Arg("id", "Request id.").Required().StringVar(&f.id)
		add(cc, func(ctx context.Context) error { return c.doRequestReview(ctx, state) })
	}
}

func splitRoles(in []string) []string {
	var out []string
	for _, s := range in {
		for _, r := range strings.Split(s, ",") {
			if r = strings.TrimSpace(r); r != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

func (c *cli) doRequestCreate(ctx context.Context) error {
	f := &c.req
	if f.ttl < 0 {
		return trace.BadParameter("--ttl %v: want a positive duration such as 1h", f.ttl)
	}
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	op := proxyapi.AccessRequestOp{Op: proxyapi.AccessRequestOpCreate, Roles: splitRoles(f.roles), Reason: f.reason}
	if f.ttl > 0 {
		op.TTL = f.ttl.String()
	}
	var r services.AccessRequest
	callCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	if err := client.AccessRequestOp(callCtx, creds, op, &r); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintln(c.stdout, r.ID)
	if !f.wait {
		return nil
	}
	return c.doRequestLogin(ctx, r.ID, true)
}

// doRequestLogin waits (if asked) for the request's review, then re-issues
// the stored certificate with its roles.
func (c *cli) doRequestLogin(ctx context.Context, id string, wait bool) error {
	st, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	if wait {
		timeout := c.req.waitTimeout
		if timeout <= 0 {
			timeout = time.Hour
		}
		fmt.Fprintf(c.stderr, "Waiting for access request %s to be reviewed...\n", id)
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		r, err := client.WaitAccessRequest(wctx, creds, id, clockwork.NewRealClock(), requestPollInterval)
		if err != nil {
			return trace.Wrap(err)
		}
		if r.State != services.RequestApproved {
			return trace.AccessDenied("access request %s was %s%s", id, r.State, lastReason(r))
		}
	}
	callCtx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	cert, agentErr, err := st.LoginWithRequest(callCtx, creds, id, os.Getenv("SSH_AUTH_SOCK"))
	if err != nil {
		return trace.Wrap(err)
	}
	if agentErr != nil {
		fmt.Fprintf(c.stderr, "WARNING: the new certificate is stored but not in ssh-agent: %v\n", trace.UserMessage(agentErr))
	}
	fmt.Fprintf(c.stderr, "Logged in with access request %s: logins %s, valid until %s.\n", id,
		strings.Join(cert.ValidPrincipals, ","), time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339))
	return nil
}

// lastReason is ": REASON" of the last review, if it gave one.
func lastReason(r *services.AccessRequest) string {
	if n := len(r.Reviews); n > 0 && r.Reviews[n-1].Reason != "" {
		return ": " + r.Reviews[n-1].Reason
	}
	return ""
}

func (c *cli) doRequestLs(ctx context.Context) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	var list []services.AccessRequest
	if err := client.AccessRequestOp(ctx, creds, proxyapi.AccessRequestOp{Op: proxyapi.AccessRequestOpList}, &list); err != nil {
		return trace.Wrap(err)
	}
	if c.req.format == "json" {
		return trace.Wrap(writeJSON(c, list))
	}
	return trace.Wrap(services.WriteAccessRequests(c.stdout, list, timeNow()))
}

func (c *cli) doRequestShow(ctx context.Context) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	var r services.AccessRequest
	if err := client.AccessRequestOp(ctx, creds, proxyapi.AccessRequestOp{Op: proxyapi.AccessRequestOpShow, ID: c.req.id}, &r); err != nil {
		return trace.Wrap(err)
	}
	if c.req.format == "json" {
		return trace.Wrap(writeJSON(c, r))
	}
	return trace.Wrap(services.WriteAccessRequest(c.stdout, &r, timeNow()))
}

func (c *cli) doRequestReview(ctx context.Context, state string) error {
	_, creds, err := c.credentials()
	if err != nil {
		return trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, client.DialTimeout*2)
	defer cancel()
	var r services.AccessRequest
	op := proxyapi.AccessRequestOp{Op: proxyapi.AccessRequestOpReview, ID: c.req.id, State: state, Reason: c.req.reason}
	if err := client.AccessRequestOp(ctx, creds, op, &r); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Access request %s is %s.\n", r.ID, r.State)
	return nil
}
