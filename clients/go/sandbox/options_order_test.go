package sandbox

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// Probe of December 6: headers no HTTP request can carry passed New, and every call then failed as
// ErrConnection / ErrRetriesExhausted. They are refused by New now, naming Headers.
func TestNewRefusesHeadersNoRequestCanCarry(t *testing.T) {
	for name, h := range map[string]http.Header{
		"a space in the name":     {"Bad Header": {"v"}},
		"a CR LF in the value":    {"X-Ok": {"v\r\nInjected: 1"}},
		"a NUL in the value":      {"X-Ok": {"a\x00b"}},
		"an empty name":           {"": {"v"}},
		"a colon in the name":     {"X:Y": {"v"}},
		"a newline in the value":  {"Authorization": {"Bearer x\n"}},
		"a non-token in the name": {"X(Y)": {"v"}},
	} {
		_, err := New(context.Background(), Options{Headers: h, K8sHelper: &K8sHelper{}})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Headers") {
			t.Errorf("%s: New = %v; want ErrInvalidArgument naming Headers", name, err)
		}
	}
	if _, err := New(context.Background(), Options{Headers: http.Header{"Authorization": {"Bearer x y\tz"}},
		K8sHelper: &K8sHelper{}}); err != nil {
		t.Errorf("New with a valid header: %v", err)
	}
}

// Probe of December 6: an invalid Namespace was reported as RouterNamespace (its default) about 40% of the
// time, by map order. Namespace is checked first, always.
func TestAnInvalidNamespaceIsReportedAsNamespace(t *testing.T) {
	for i := 0; i < 50; i++ {
		_, err := New(context.Background(), Options{Namespace: "Bad NS", K8sHelper: &K8sHelper{}})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `Namespace "Bad NS"`) ||
			strings.Contains(err.Error(), "RouterNamespace") {
			t.Fatalf("New = %v; want the Namespace named", err)
		}
	}
	for i := 0; i < 20; i++ {
		_, err := New(context.Background(), Options{SandboxReadyTimeout: -1, RequestTimeout: -1, K8sHelper: &K8sHelper{}})
		if err == nil || !strings.Contains(err.Error(), "SandboxReadyTimeout") {
			t.Fatalf("New = %v; want the first invalid timeout in field order, SandboxReadyTimeout", err)
		}
	}
}
