#!/usr/bin/env bash
# check-package.sh: build the packages (make package) and check them.
#
# Everywhere: the .deb's control data and contents (dpkg-deb -I/-c), the
# conffile, modes, the man pages and completions, the extracted binaries
# run (--version), `systemd-analyze verify` of postern.service alone and
# with each drop-in example (any warning fails), the .rpm's file list
# (`rpm -qpl`, when rpm is installed).
#
# With CI=true (CI runs as root on a throwaway machine) it also installs
# the .deb with dpkg -i, checks /etc/postern/postern.yaml is a conffile and
# the postern user and /var/lib/postern (0700) exist, starts the packaged
# daemon directly (systemd is not PID 1 there) with the packaged config and
# data dir and waits for /readyz, then `dpkg -r` (the data dir is kept) and
# `dpkg -P` (it is gone). Never run that part on a machine you care about:
# it installs and purges the postern package.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
fail() { echo "check-package: FAIL: $*" >&2; exit 1; }
step() { echo "--- check-package: $*"; }

for tool in dpkg-deb systemd-analyze curl; do
	command -v "$tool" >/dev/null || fail "$tool is missing (.ci/run installs it: apt-get install dpkg systemd curl)"
done

step "make package"
start=$(date +%s%N)
make --no-print-directory package BUILD_DIR="$BUILD_DIR"
took_ms=$((($(date +%s%N) - start) / 1000000))
deb=$(ls "$BUILD_DIR"/postern_*_amd64.deb)
rpm=$(ls "$BUILD_DIR"/postern_*_amd64.rpm)
[ "$(echo "$deb" | wc -l)" = 1 ] || fail "more than one .deb in $BUILD_DIR: $deb"
version=$(dpkg-deb -f "$deb" Version)
echo "make package took $((took_ms / 1000)).$(printf %03d $((took_ms % 1000)))s"
ls -l "$deb" "$rpm"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step "dpkg-deb -I $deb"
dpkg-deb -I "$deb"
[ "$(dpkg-deb -f "$deb" Package)" = postern ] || fail "package name"
[ "$(dpkg-deb -f "$deb" Architecture)" = amd64 ] || fail "architecture"
dpkg-deb --ctrl-tarfile "$deb" | tar -x -C "$tmp" ./conffiles ./postinst ./prerm ./postrm
[ "$(cat "$tmp/conffiles")" = /etc/postern/postern.yaml ] || fail "conffiles: $(cat "$tmp/conffiles")"
for s in postinst prerm postrm; do
	sh -n "$tmp/$s" || fail "$s does not parse"
done

step "dpkg-deb -c $deb"
dpkg-deb -c "$deb" | tee "$tmp/contents"
expect() { # MODE PATH
	grep -qE "^$1 root/root +[0-9]+ [0-9-]+ [0-9:]+ \.$2\$" "$tmp/contents" || fail "$2 with mode $1 not in the .deb"
}
for b in postern psh pctl; do
	expect -rwxr-xr-x "/usr/bin/$b"
	expect -rw-r--r-- "/usr/share/man/man1/$b.1.gz"
	expect -rw-r--r-- "/usr/share/bash-completion/completions/$b"
	expect -rw-r--r-- "/usr/share/zsh/vendor-completions/_$b"
done
expect -rw-r----- /etc/postern/postern.yaml
expect -rw-r--r-- /lib/systemd/system/postern.service
expect -rw-r--r-- /usr/share/doc/postern/examples/systemd/auth-proxy.conf
expect -rw-r--r-- /usr/share/doc/postern/examples/systemd/node-only.conf

step "the extracted binaries run"
root="$tmp/root"
dpkg-deb -x "$deb" "$root"
for b in postern psh pctl; do
	out=$("$root/usr/bin/$b" --version)
	echo "$b --version: $out"
	case "$out" in "$b "?*) ;; *) fail "$b --version printed '$out'" ;; esac
	zcat "$root/usr/share/man/man1/$b.1.gz" | grep -q "^$b \\\\- " || fail "$b.1 has no NAME line"
	bash -n "$root/usr/share/bash-completion/completions/$b" || fail "bash completion of $b"
	if command -v zsh >/dev/null; then zsh -n "$root/usr/share/zsh/vendor-completions/_$b" || fail "zsh completion of $b"; fi
done
# The completion scripts call the binary back: it must answer.
"$root/usr/bin/pctl" --completion-bash users | grep -qx add || fail "pctl --completion-bash users does not offer add"
"$root/usr/bin/postern" start --config "$root/etc/postern/postern.yaml" --help >/dev/null || fail "postern start --help"

step "systemd-analyze verify"
# The unit as installed, its binary pointed at the extracted one; then with
# each drop-in example. verify exits 0 on some warnings: any output fails.
verify() { # NAME [DROPIN]
	local dir="$tmp/units-$1"
	mkdir -p "$dir/postern.service.d"
	sed "s#/usr/bin/postern#$root/usr/bin/postern#" "$root/lib/systemd/system/postern.service" >"$dir/postern.service"
	if [ -n "${2:-}" ]; then
		sed "s#/usr/bin/postern#$root/usr/bin/postern#" "$2" >"$dir/postern.service.d/$(basename "$2")"
	fi
	local out
	out=$(systemd-analyze verify --man=no "$dir/postern.service" 2>&1) || fail "systemd-analyze verify ($1): $out"
	[ -z "$out" ] || fail "systemd-analyze verify ($1): $out"
	echo "postern.service ($1): verified"
}
verify unit
verify auth-proxy "$root/usr/share/doc/postern/examples/systemd/auth-proxy.conf"
verify node-only "$root/usr/share/doc/postern/examples/systemd/node-only.conf"
if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
	systemd-analyze security --offline=true --no-pager "$tmp/units-auth-proxy/postern.service" 2>/dev/null | tail -1 | sed 's/^/auth-proxy drop-in: /' || true
fi

step "rpm"
if command -v rpm >/dev/null; then
	rpm -K --nosignature "$rpm" || fail "rpm -K: the .rpm's digests"
	rpm -qpi "$rpm" 2>/dev/null | head -5
	rpm -qpl "$rpm" | tee "$tmp/rpm-files"
	for f in /usr/bin/postern /usr/bin/psh /usr/bin/pctl /etc/postern/postern.yaml /usr/lib/systemd/system/postern.service \
		/usr/share/man/man1/postern.1.gz /usr/share/zsh/site-functions/_psh; do
		grep -qx "$f" "$tmp/rpm-files" || fail "$f not in the .rpm"
	done
	rpm -qpc "$rpm" | grep -qx /etc/postern/postern.yaml || fail "postern.yaml is not %config in the .rpm"
	rpm -qp --scripts "$rpm" | grep -q 'chmod 0700 "$DATA_DIR"' || fail "the .rpm's %post does not create the data dir"
else
	echo "rpm is not installed: the .rpm is checked by scripts/package's Go test only"
fi

if [ "${CI:-}" != true ]; then
	echo "check-package: packages OK (CI=true also installs, runs and purges the .deb)"
	exit 0
fi

step "CI: dpkg -i $deb"
[ "$(id -u)" = 0 ] || fail "the install check needs root"
if dpkg -s postern >/dev/null 2>&1; then dpkg -P postern; fi
rm -rf /var/lib/postern /etc/postern
dpkg -i "$deb"
grep -qx /etc/postern/postern.yaml /var/lib/dpkg/info/postern.conffiles || fail "postern.yaml is not a conffile"
[ "$(stat -c %a /var/lib/postern)" = 700 ] || fail "/var/lib/postern is $(stat -c %a /var/lib/postern), want 700"
getent passwd postern >/dev/null || fail "no postern user"
[ "$(stat -c %a:%U:%G /etc/postern/postern.yaml)" = 640:root:postern ] || fail "postern.yaml is $(stat -c %a:%U:%G /etc/postern/postern.yaml)"
[ "$(postern --version)" = "$("$root/usr/bin/postern" --version)" ] || fail "the installed postern is not the packaged one"

step "CI: the packaged daemon starts with the packaged config"
# Ports of the packaged config (3021-3025, 3080, diagnostics 3000) must be
# free; a test cluster left running would make this fail loudly.
log="$tmp/postern.log"
postern start --config /etc/postern/postern.yaml >"$log" 2>&1 &
pid=$!
ready=""
for _ in $(seq 1 300); do
	if curl -fsS http://127.0.0.1:3000/readyz >/dev/null 2>&1; then ready=1; break; fi
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.2
done
if [ -z "$ready" ]; then
	kill "$pid" 2>/dev/null || true
	cat "$log" >&2
	fail "the packaged daemon never became ready"
fi
echo "ready: $(curl -fsS http://127.0.0.1:3000/readyz)"
pctl --data-dir /var/lib/postern nodes ls || fail "pctl against the packaged daemon"
kill -HUP "$pid"
sleep 1
kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "SIGHUP stopped the daemon"; }
grep -q "Reload: applied debug and log_format" "$log" || { cat "$log" >&2; fail "SIGHUP did not reload"; }
kill -TERM "$pid"
wait "$pid" || { cat "$log" >&2; fail "the daemon did not exit 0 on SIGTERM"; }
[ -n "$(ls -A /var/lib/postern)" ] || fail "the daemon wrote nothing in /var/lib/postern"

step "CI: dpkg -r keeps the data, dpkg -P deletes it"
dpkg -r postern
[ -d /var/lib/postern ] && [ -n "$(ls -A /var/lib/postern)" ] || fail "dpkg -r removed /var/lib/postern"
[ -f /etc/postern/postern.yaml ] || fail "dpkg -r removed the conffile"
[ ! -e /usr/bin/postern ] || fail "dpkg -r left /usr/bin/postern"
dpkg -P postern
[ ! -e /var/lib/postern ] || fail "dpkg -P kept /var/lib/postern"
[ ! -e /etc/postern/postern.yaml ] || fail "dpkg -P kept the conffile"
echo "check-package: packages OK, installed, ran, removed and purged"
