package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// retriedCreateAPI: a RoundTripper serving sandboxclaims in ns "ns". The first POST is applied and answered 500 with
// Retry-After (etcd "unreachable" -> ServerTimeout, as the API server does); client-go retries the POST and
// that attempt's dial is refused (the API server restarting). LIST/DELETE work.
type retriedCreateAPI struct {
	mu     sync.Mutex
	posts  int
	lists  int
	claims map[string]map[string]any
}

func (f *retriedCreateAPI) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := func(code int, body any, hdr map[string]string) *http.Response {
		b, _ := json.Marshal(body)
		h := http.Header{"Content-Type": []string{"application/json"}}
		for k, v := range hdr {
			h.Set(k, v)
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(bytes.NewReader(b)), Request: req}
	}
	path := req.URL.Path
	switch {
	case req.Method == "POST" && strings.HasSuffix(path, "/sandboxclaims"):
		f.posts++
		if f.posts == 1 {
			var obj map[string]any
			b, _ := io.ReadAll(req.Body)
			_ = json.Unmarshal(b, &obj)
			md := obj["metadata"].(map[string]any)
			name := fmt.Sprintf("%sabcde", md["generateName"])
			md["name"], md["uid"], md["namespace"] = name, "uid-1", "ns"
			f.claims[name] = obj
			return resp(500, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
				"reason": "ServerTimeout", "message": "etcd unreachable", "details": map[string]any{"retryAfterSeconds": 1}},
				map[string]string{"Retry-After": "1"}), nil
		}
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case req.Method == "GET" && strings.HasSuffix(path, "/sandboxclaims"):
		f.lists++
		items := []any{}
		for _, c := range f.claims {
			items = append(items, c)
		}
		return resp(200, map[string]any{"kind": "SandboxClaimList", "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
			"metadata": map[string]any{}, "items": items}, nil), nil
	case req.Method == "DELETE":
		name := path[strings.LastIndex(path, "/")+1:]
		delete(f.claims, name)
		return resp(200, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Success"}, nil), nil
	}
	return resp(404, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}, nil), nil
}

// A create client-go retried (a 500 with Retry-After) whose last attempt could not connect may have been applied
// by the first: it is a lost answer, searched for by its stamp, not a create that was never sent.
func TestARetriedCreateWhoseLastAttemptWasRefusedIsStillSearched(t *testing.T) {
	f := &retriedCreateAPI{claims: map[string]map[string]any{}}
	k, err := NewK8sHelper(&rest.Config{Host: "https://api.example:6443", Transport: f}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(context.Background(), Options{WarmPoolName: "pool", Namespace: "ns", Quiet: true,
		K8sHelper: k, CleanupTimeout: 3 * time.Second, APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateSandbox(context.Background(), "", "")
	t.Logf("CreateSandbox = %v (posts %d, lists %d, orphaned %v)", err, f.posts, f.lists, errors.Is(err, ErrOrphanedClaim))
	if derr := c.DeleteAll(context.Background()); derr != nil {
		t.Logf("DeleteAll = %v", derr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.claims) != 0 {
		t.Errorf("%d claim(s) left after the failed CreateSandbox and DeleteAll (the first POST was applied): leaked", len(f.claims))
	}
}
