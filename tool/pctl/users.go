package main

import (
	"bufio"
	"context"
	"fmt"
	"github.com/postern-dev/postern/lib/services"
	"os"
	"strings"

	"github.com/alecthomas/kingpin/v2"
	"github.com/gravitational/trace"
	"golang.org/x/term"
)

type adder func(*kingpin.CmdClause, func(context.Context) error)

func (c *cli) registerUsers(app *kingpin.Application, add adder) {
	users := app.Command("users", "Manage users.")

	var name, logins, roles string
	var otp bool
	ua := users.Command("add", "Add a user; the password is read from the terminal, or from stdin when it is not one.")
	ua.Arg("name", "User name.").Required().StringVar(&name)
	ua.Flag("logins", "OS logins the user may use (the logins trait): L1,L2.").Required().StringVar(&logins)
	ua.Flag("roles", "Roles (default access).").StringVar(&roles)
	ua.Flag("otp", "Require a TOTP one-time password at login; prints the enrolment URL.").BoolVar(&otp)
	add(ua, func(ctx context.Context) error { return c.usersAdd(ctx, name, logins, roles, otp) })

	var lsFormat string
	ul := users.Command("ls", "List users.")
	listFormatFlag(ul, &lsFormat)
	add(ul, func(ctx context.Context) error { return c.usersLs(ctx, lsFormat) })

	var rmName string
	ur := users.Command("rm", "Remove a user.")
	ur.Arg("name", "User name.").Required().StringVar(&rmName)
	add(ur, func(ctx context.Context) error { return c.usersRm(ctx, rmName) })

	var upName, upRoles, upLogins string
	var upRolesSet, upLoginsSet bool
	uu := users.Command("update", "Change an existing user's roles and/or logins (from the user's next login on).")
	uu.Arg("name", "User name.").Required().StringVar(&upName)
	uu.Flag("roles", "Replace the roles: R1,R2.").IsSetByUser(&upRolesSet).StringVar(&upRoles)
	uu.Flag("logins", "Replace the OS logins (the logins trait): L1,L2.").IsSetByUser(&upLoginsSet).StringVar(&upLogins)
	add(uu, func(ctx context.Context) error {
		var roles, logins []string
		if upRolesSet {
			if roles = splitList(upRoles); roles == nil {
				return trace.BadParameter("--roles is empty: a user needs at least one role")
			}
		}
		if upLoginsSet {
			if logins = splitList(upLogins); logins == nil {
				return trace.BadParameter("--logins is empty: give at least one login")
			}
		}
		return c.usersUpdate(ctx, upName, roles, logins)
	})

	var rpName string
	rp := users.Command("reset-password", "Set a user's password (read like users add does) and end the user's web sessions.")
	rp.Arg("name", "User name.").Required().StringVar(&rpName)
	add(rp, func(ctx context.Context) error { return c.usersResetPassword(ctx, rpName) })

	var clName, clAddr string
	cl := users.Command("clear-lockout", "Clear a user's failed-login counts and lockouts, from every address (see also pctl unlock for locks).")
	cl.Arg("name", "User name.").Required().StringVar(&clName)
	cl.Flag("addr", "Also clear the lockout of this source address (for every user).").StringVar(&clAddr)
	add(cl, func(ctx context.Context) error { return c.usersClearLockout(ctx, clName, clAddr) })

	var resetName string
	rm := users.Command("reset-mfa", "Remove every second factor of a user (OTP and passkeys), for a lost device; audited (mfa.reset).")
	rm.Arg("name", "User name.").Required().StringVar(&resetName)
	add(rm, func(ctx context.Context) error { return c.usersResetMFA(ctx, resetName) })
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// readPassword reads the new user's password: twice without echo from a
// terminal, or one line from a pipe (scripts, make run).
func (c *cli) readPassword() ([]byte, error) {
	if f, ok := c.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(os.Stderr, "Password: ")
		p1, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(os.Stderr)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		fmt.Fprint(os.Stderr, "Repeat password: ")
		p2, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(os.Stderr)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if string(p1) != string(p2) {
			return nil, trace.BadParameter("passwords do not match")
		}
		return p1, nil
	}
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && line == "" {
		return nil, trace.BadParameter("no password on stdin")
	}
	return []byte(strings.TrimRight(line, "\r\n")), nil
}

// minPasswordLength keeps trivially guessable passwords out; the login rate
// limit does the rest.
const minPasswordLength = 8

func (c *cli) usersAdd(ctx context.Context, name, logins, roles string, otp bool) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	password, err := c.readPassword()
	if err != nil {
		return trace.Wrap(err)
	}
	if len(password) < minPasswordLength {
		return trace.BadParameter("password too short: at least %d characters", minPasswordLength)
	}
	url, err := clt.CreateUser(ctx, name, password, splitList(logins), splitList(roles), otp)
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "User %q added.\n", name)
	if url != "" {
		fmt.Fprintf(c.stdout, "One-time password enrolment (add it to an authenticator app):\n%s\n", url)
	}
	c.warnLocked(ctx, clt, name)
	return nil
}

func (c *cli) usersLs(ctx context.Context, format string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	users, err := clt.GetUsers(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	for i := range users {
		// The API strips them already; a listing never carries secrets
		// whatever a future server sends.
		users[i].PasswordHash, users[i].TOTPSecret = nil, ""
	}
	return trace.Wrap(writeList(c.stdout, format, users, func() error {
		tw := services.NewTable(c.stdout, "USER", "ROLES", "LOGINS", "MFA", "CONNECTOR")
		for _, u := range users {
			// The second factors, "otp" and "webauthn:2" (kind and
			// count), from the listing: the secrets never reach pctl.
			mfa := "-"
			if len(u.MFA) > 0 {
				mfa = services.EscapeList(u.MFA, ",")
			} else if u.OTPEnabled {
				mfa = "otp"
			}
			// A single sign-on user (sso:NAME) has no password: its
			// roles come from the identity provider at each login.
			conn := u.Connector
			if conn == "" {
				conn = "local"
			}
			tw.Row(u.Name, services.EscapeList(u.Roles, ","), services.EscapeList(u.Traits["logins"], ","), mfa, services.EscapeText(conn))
		}
		return tw.Flush()
	}))
}

func (c *cli) usersUpdate(ctx context.Context, name string, roles, logins []string) error {
	if roles == nil && logins == nil {
		return trace.BadParameter("nothing to change: give --roles and/or --logins")
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	u, err := clt.UpdateUser(ctx, name, roles, logins)
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "User %q updated: roles %s, logins %s.\n", name,
		services.EscapeList(u.Roles, ","), services.EscapeList(u.Traits[services.TraitLogins], ","))
	fmt.Fprintln(c.stdout, "It applies from the user's next login; certificates issued before keep their roles and logins until they expire (pctl lock --user cuts them now).")
	return nil
}

func (c *cli) usersResetPassword(ctx context.Context, name string) error {
	password, err := c.readPassword()
	if err != nil {
		return trace.Wrap(err)
	}
	if len(password) < minPasswordLength {
		return trace.BadParameter("password too short: at least %d characters", minPasswordLength)
	}
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	ended, err := clt.ResetPassword(ctx, name, password)
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Password of %q reset; %d web session(s) ended.\n", name, ended)
	fmt.Fprintln(c.stdout, "SSH certificates issued before run until they expire (pctl lock --user cuts them now).")
	return nil
}

func (c *cli) usersRm(ctx context.Context, name string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	if err := clt.DeleteUser(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "User %q removed.\n", name)
	return nil
}

func (c *cli) usersClearLockout(ctx context.Context, name, addr string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	cleared, err := clt.ClearLockout(ctx, name, addr)
	if err != nil {
		return trace.Wrap(err)
	}
	if !cleared {
		fmt.Fprintf(c.stdout, "No login lockout or failed attempts recorded for %q.\n", name)
		return nil
	}
	fmt.Fprintf(c.stdout, "Failed logins and lockouts of %q cleared.\n", name)
	return nil
}

func (c *cli) usersResetMFA(ctx context.Context, name string) error {
	clt, _, err := c.connect(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	defer clt.Close()
	n, err := clt.ResetMFA(ctx, name)
	if err != nil {
		return trace.Wrap(err)
	}
	fmt.Fprintf(c.stdout, "Removed %d second factor(s) of %q; they log in with the password alone until they register one (unless auth_preference requires one).\n", n, name)
	return nil
}
