# Shared by the postern package's maintainer scripts (deb and rpm); the
# package program puts it at the top of each script.
DATA_DIR=/var/lib/postern
CONFIG=/etc/postern/postern.yaml

# postern_setup creates the postern system user (auth and proxy run as it
# with the auth-proxy drop-in) and the data dir, 0700; it never touches
# what the data dir holds.
postern_setup() {
	if ! getent group postern >/dev/null 2>&1; then
		groupadd --system postern
	fi
	if ! getent passwd postern >/dev/null 2>&1; then
		useradd --system --gid postern --home-dir "$DATA_DIR" --no-create-home \
			--shell /usr/sbin/nologin --comment "Postern SSH access proxy" postern
	fi
	if [ ! -d "$DATA_DIR" ]; then
		mkdir -p "$DATA_DIR"
	fi
	chmod 0700 "$DATA_DIR"
	# The config may hold a join token: root and the postern group only.
	if [ -f "$CONFIG" ] && [ "$(stat -c %G "$CONFIG")" = root ]; then
		chgrp postern "$CONFIG"
		chmod 0640 "$CONFIG"
	fi
}

# systemd_running: true only when systemd is the init system (not in a
# container or chroot without it, nor on CI).
systemd_running() {
	[ -d /run/systemd/system ]
}

systemd_reload() {
	if systemd_running; then
		systemctl daemon-reload >/dev/null 2>&1 || true
	fi
}
