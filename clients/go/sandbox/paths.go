package sandbox

import (
	"path"
	"strings"
)

// escapeAll percent-encodes every byte outside RFC 3986 unreserved (A-Z a-z 0-9 - _ . ~), so "/" -> "%2F".
func escapeAll(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// dotSegment encodes a bare "." / ".." so no HTTP stack removes it as a dot segment.
func dotSegment(s string) (string, bool) {
	switch s {
	case ".":
		return "%2E", true
	case "..":
		return "%2E%2E", true
	}
	return "", false
}

// legacyPathParam is the legacy runtime's {path} parameter (spec 4.7.5): the whole path in one segment.
func legacyPathParam(p string) string {
	if d, ok := dotSegment(p); ok {
		return d
	}
	return escapeAll(p)
}

// sandboxdPathParam is sandboxd's {path} (spec 3.5 point 3): each "/"-separated segment encoded with
// nothing safe, "." and ".." as %2E / %2E%2E, joined by %2F.
func sandboxdPathParam(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if d, ok := dotSegment(s); ok {
			segs[i] = d
		} else {
			segs[i] = escapeAll(s)
		}
	}
	return strings.Join(segs, "%2F")
}

// sanitizeFilePath is the client-side check for Write and Read (Python SDK rule): no control characters,
// not empty, POSIX-normalised, leading "/" dropped, and no "." / ".." segment left. The result is relative to
// the runtime root.
func sanitizeFilePath(p string) (string, error) {
	if err := checkControlChars(p); err != nil {
		return "", err
	}
	if strings.TrimSpace(p) == "" {
		return "", invalidf("path must not be empty")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", invalidf("path %q must not contain a '..' segment", p)
		}
	}
	clean := strings.TrimLeft(path.Clean("/"+p), "/")
	if clean == "" || clean == "." {
		return "", invalidf("path %q does not name a file", p)
	}
	return clean, nil
}

// checkSandboxdWritePath adds sandboxd's write rule (spec 4.7.6): no trailing "/".
func checkSandboxdWritePath(p string) error {
	if strings.HasSuffix(p, "/") {
		return invalidf("path %q must not end with '/'", p)
	}
	return nil
}

// checkControlChars refuses a path with a control character (ErrInvalidArgument), as the Python SDK's sanitizer.
func checkControlChars(p string) error {
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return invalidf("path %q contains a control character", p)
		}
	}
	return nil
}
