package srv

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gravitational/trace"
)

// Sessions' locale. A client sends LANG and LC_* as `env` requests (psh
// does, as OpenSSH's `SendEnv LANG LC_*`; the web terminal sends the
// browser's language); without them a shell runs in the POSIX locale,
// where readline garbles every non-ASCII character typed. So:
//   - the values are checked against a locale name's charset (they reach
//     every program's setlocale, and nothing else belongs in them);
//   - LANG and the locale categories (LC_CTYPE, ...) are set only when the
//     locale is installed on this node: glibc refuses the whole locale
//     when one category names a missing one, which would leave the shell
//     in POSIX after all;
//   - a session whose client sent no usable LANG or LC_ALL gets the
//     node's default (LocaleConfig.Default).

// LocaleConfig decides the locale of sessions.
type LocaleConfig struct {
	// Default is LANG for a session whose client sent no usable LANG or
	// LC_ALL. Empty means the system's default (SystemDefaultLocale):
	// LANG in /etc/default/locale or /etc/locale.conf, else C.UTF-8 when
	// installed. "POSIX" keeps such sessions in the POSIX locale.
	Default string
	// Installed reports whether a locale can be used on this node (C and
	// POSIX always can). Nil means glibc's (InstalledLocale under
	// /usr/lib/locale).
	Installed func(name string) bool
}

// checkAndSetDefaults fills in the system's default and installed set.
func (c *LocaleConfig) checkAndSetDefaults() error {
	if c.Installed == nil {
		c.Installed = func(name string) bool { return InstalledLocale(systemLocaleDir, name) }
	}
	if c.Default == "" {
		c.Default = SystemDefaultLocale("/", c.Installed)
	}
	if c.Default != "" && !validLocaleValue(c.Default) {
		return trace.BadParameter("srv: default locale %q is not a locale name (letters, digits and _.@+-)", c.Default)
	}
	return nil
}

// systemLocaleDir is where glibc keeps compiled locales.
const systemLocaleDir = "/usr/lib/locale"

// maxLocaleValue bounds an LC_* or LANG value: real names are under 30
// bytes (sr_RS.UTF-8@latin).
const maxLocaleValue = 64

// validLocaleValue: a locale name's charset, language[_territory]
// [.codeset][@modifier] (and the short values some terminals carry in
// LC_* variables, e.g. LC_TERMINAL=iTerm2). No '/': glibc would read a
// path, and no '=' or control characters.
func validLocaleValue(v string) bool {
	if v == "" || len(v) > maxLocaleValue {
		return false
	}
	for _, r := range v {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r == '_', r == '.', r == '@', r == '+', r == '-':
		default:
			return false
		}
	}
	return true
}

// localeCategories are the names glibc reads a locale from (LANG is the
// fallback of them all); other LC_* names carry plain values.
var localeCategories = map[string]bool{
	"LANG": true, "LC_ALL": true, "LC_CTYPE": true, "LC_NUMERIC": true, "LC_TIME": true,
	"LC_COLLATE": true, "LC_MONETARY": true, "LC_MESSAGES": true, "LC_PAPER": true, "LC_NAME": true,
	"LC_ADDRESS": true, "LC_TELEPHONE": true, "LC_MEASUREMENT": true, "LC_IDENTIFICATION": true,
}

// isLocaleVar reports whether name is LANG or LC_*, the variables whose
// values must be locale names.
func isLocaleVar(name string) bool {
	return name == "LANG" || (strings.HasPrefix(name, "LC_") && len(name) > 3)
}

// checkLocaleEnv decides an env request for a locale variable: "" when it
// is set, else why it is not.
func checkLocaleEnv(cfg LocaleConfig, name, value string) string {
	if !validLocaleValue(value) {
		return "not a locale name"
	}
	if localeCategories[name] && value != "C" && value != "POSIX" && !cfg.Installed(value) {
		return "locale not installed on this node"
	}
	return ""
}

// SystemDefaultLocale is the locale a login gets on this machine: LANG
// from root/etc/default/locale (Debian) or root/etc/locale.conf (systemd),
// else C.UTF-8 when installed, else "" (POSIX).
func SystemDefaultLocale(root string, installed func(string) bool) string {
	for _, f := range []string{"etc/default/locale", "etc/locale.conf"} {
		if v := readLangFile(filepath.Join(root, f)); v != "" && validLocaleValue(v) {
			return v
		}
	}
	if installed("C.UTF-8") {
		return "C.UTF-8"
	}
	return ""
}

// readLangFile reads LANG= from a shell-style assignments file.
func readLangFile(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	lang := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		line = strings.TrimPrefix(line, "export ")
		if v, ok := strings.CutPrefix(line, "LANG="); ok {
			lang = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return lang
}

// InstalledLocale reports whether glibc can load locale name from dir
// (/usr/lib/locale): C and POSIX always; otherwise a directory of the
// name (as given or with its codeset normalized, as localedef writes it:
// C.UTF-8 is C.utf8) or an entry of dir/locale-archive.
func InstalledLocale(dir, name string) bool {
	if name == "C" || name == "POSIX" {
		return true
	}
	if !validLocaleValue(name) {
		return false
	}
	cands := []string{name}
	if n := normalizeLocale(name); n != name {
		cands = append(cands, n)
	}
	for _, c := range cands {
		if fi, err := os.Stat(filepath.Join(dir, c)); err == nil && fi.IsDir() {
			return true
		}
	}
	f, err := os.Open(filepath.Join(dir, "locale-archive"))
	if err != nil {
		return false
	}
	defer f.Close()
	names, err := localeArchiveNames(f)
	if err != nil {
		return false
	}
	for _, n := range names {
		for _, c := range cands {
			if n == c {
				return true
			}
		}
	}
	return false
}

// normalizeLocale normalizes the codeset as glibc's
// _nl_normalize_codeset does: letters lower-cased, digits kept, anything
// else dropped, "iso" before an all-digit result (UTF-8 -> utf8).
func normalizeLocale(name string) string {
	dot := strings.IndexByte(name, '.')
	if dot < 0 {
		return name
	}
	rest := name[dot+1:]
	mod := ""
	if at := strings.IndexByte(rest, '@'); at >= 0 {
		rest, mod = rest[:at], rest[at:]
	}
	var b strings.Builder
	digits := true
	for _, r := range rest {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r)
			digits = false
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r + 'a' - 'A')
			digits = false
		case r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	cs := b.String()
	if digits && cs != "" {
		cs = "iso" + cs
	}
	return name[:dot+1] + cs + mod
}

// The locale archive (glibc locale/locarchive.h): a header of 32-bit
// words in the machine's byte order, a hash table of names, and a string
// table they point into.
const (
	localeArchiveMagic = 0xde020109
	// localeArchiveHeader: magic, serial, then offset/used/size of the
	// name hash, the strings, the locale records and the sums.
	localeArchiveHeader = 14 * 4
	localeNameEntry     = 3 * 4 // hashval, name_offset, locrec_offset
	// maxArchiveNames bounds the hash table read: a full locales-all
	// archive has under 1,000 names.
	maxArchiveNames = 1 << 16
	// maxArchiveStrings bounds the string table read.
	maxArchiveStrings = 4 << 20
)

// localeArchiveNames lists the locale names in a glibc locale archive.
// It reads only the header, the name table and the strings, never the
// locale data (an archive of every locale is hundreds of MB).
func localeArchiveNames(r io.ReaderAt) ([]string, error) {
	var hdr [localeArchiveHeader]byte
	if _, err := r.ReadAt(hdr[:], 0); err != nil {
		return nil, trace.BadParameter("locale archive: short header: %v", err)
	}
	order := binary.ByteOrder(binary.LittleEndian)
	if order.Uint32(hdr[0:]) != localeArchiveMagic {
		order = binary.BigEndian
		if order.Uint32(hdr[0:]) != localeArchiveMagic {
			return nil, trace.BadParameter("locale archive: bad magic %#x", binary.LittleEndian.Uint32(hdr[0:]))
		}
	}
	word := func(i int) uint32 { return order.Uint32(hdr[4*i:]) }
	hashOff, hashSize := int64(word(2)), int64(word(4))
	strOff, strUsed := int64(word(5)), int64(word(6))
	if hashSize > maxArchiveNames {
		return nil, trace.BadParameter("locale archive: %d name slots exceed %d", hashSize, maxArchiveNames)
	}
	if strUsed > maxArchiveStrings {
		return nil, trace.BadParameter("locale archive: %d bytes of strings exceed %d", strUsed, maxArchiveStrings)
	}
	table := make([]byte, hashSize*localeNameEntry)
	if _, err := r.ReadAt(table, hashOff); err != nil && !(err == io.EOF && len(table) == 0) {
		return nil, trace.BadParameter("locale archive: name table: %v", err)
	}
	strs := make([]byte, strUsed)
	if _, err := r.ReadAt(strs, strOff); err != nil && !(err == io.EOF && len(strs) == 0) {
		return nil, trace.BadParameter("locale archive: strings: %v", err)
	}
	var names []string
	for i := int64(0); i < hashSize; i++ {
		e := table[i*localeNameEntry:]
		nameOff := int64(order.Uint32(e[4:]))
		if nameOff == 0 {
			continue // an empty slot
		}
		// Name offsets count from the start of the file.
		at := nameOff - strOff
		if at < 0 || at >= int64(len(strs)) {
			return nil, trace.BadParameter("locale archive: name %d outside the string table", i)
		}
		end := bytes.IndexByte(strs[at:], 0)
		if end < 0 {
			return nil, trace.BadParameter("locale archive: name %d is not terminated", i)
		}
		names = append(names, string(strs[at:at+int64(end)]))
	}
	return names, nil
}

// withDefaultLocale adds LANG=def to env unless the client set LANG or
// LC_ALL (which decide every category) or def is empty.
func withDefaultLocale(env []string, def string) []string {
	if def == "" {
		return env
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "LANG=") || strings.HasPrefix(kv, "LC_ALL=") {
			return env
		}
	}
	return append(env, "LANG="+def)
}
