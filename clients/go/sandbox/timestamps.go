package sandbox

import (
	"strings"
	"time"
)

// parseTime is this SDK's one reader of timestamps (a claim's or an archived Sandbox's shutdownTime, a
// condition's lastTransitionTime, a file's modified_at): RFC 3339 with any fraction length (up to Go's
// nine digits), read as every other reader of these fields does (the controllers, the CLI, routers, the
// Python SDK's parse_time). The CRDs' date-time format admits a lowercase `t` and `z`, which time.Parse
// rejects: such a value is upper-cased first (an RFC 3339 timestamp has no other letters). Until December
// 6 a lowercase one was not read, and an expired claim or archive looked live.
func parseTime(text string) (time.Time, error) {
	return time.Parse(time.RFC3339Nano, strings.ToUpper(strings.TrimSpace(text)))
}
