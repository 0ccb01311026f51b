// Package api holds what crosses Postern's wires: the bodies of the web
// API (webapi), of the auth API (authapi) and of the proxy's SSH
// subsystems (proxyapi), and the one strict JSON decoder every server uses
// to read a request body.
//
// It is a leaf: it and its sub-packages import nothing of Postern's
// servers (lib/auth, lib/srv, lib/web, lib/proxy, lib/service), only
// data-type packages such as lib/services and lib/events. That is what lets
// psh, and any future client, speak to a proxy or an auth server without
// linking either (tool/psh's TestPshLinksNoServer checks it), and what lets
// a server and its clients share one definition of each body instead of
// two that drift apart.
package api
