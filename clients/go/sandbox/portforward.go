package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// tunnel is a running SPDY port-forward to a Pod (no kubectl): local[i] forwards to the i-th remote port.
type tunnel struct {
	local []int
	done  chan struct{} // closed when the tunnel ends (died or closed)
	stop  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	fail  error
	errs  *lockedBuffer
}

func (t *tunnel) close() { t.once.Do(func() { close(t.stop) }) }

// err is why the tunnel ended (nil after a normal close).
func (t *tunnel) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fail == nil && t.errs.Len() > 0 {
		return fmt.Errorf("%s", t.errs.String())
	}
	return t.fail
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.buf.String() }

func (b *lockedBuffer) Len() int { b.mu.Lock(); defer b.mu.Unlock(); return b.buf.Len() }

// portForwardURL is the pods/portforward subresource URL of ns/pod on the API server.
func portForwardURL(host, apiPath, ns, pod string) (*url.URL, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "" {
		u, err = url.Parse("https://" + host)
		if err != nil {
			return nil, err
		}
	}
	u.Path = path.Join("/", u.Path, apiPath, "api/v1/namespaces", ns, "pods", pod, "portforward")
	return u, nil
}

// startPortForward forwards 127.0.0.1:<random> to each of ports on ns/pod and waits (readyTimeout) until
// the listeners are up. A monitor closes done when the connection is lost.
func startPortForward(ctx context.Context, k *K8sHelper, ns, pod string, ports []int,
	readyTimeout time.Duration) (*tunnel, error) {
	rt, upgrader, err := spdy.RoundTripperFor(k.Config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	u, err := portForwardURL(k.Config.Host, k.Config.APIPath, ns, pod)
	if err != nil {
		return nil, fmt.Errorf("port-forward URL: %w", err)
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	specs := make([]string, len(ports))
	for i, p := range ports {
		specs[i] = "0:" + strconv.Itoa(p)
	}
	t := &tunnel{done: make(chan struct{}), stop: make(chan struct{}), errs: &lockedBuffer{}}
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, specs, t.stop, ready, nil, t.errs)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, pod, err)
	}
	go func() {
		err := fw.ForwardPorts()
		t.mu.Lock()
		t.fail = err
		t.mu.Unlock()
		close(t.done)
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-ready:
	case <-t.done:
		return nil, fmt.Errorf("port-forward to pod %s/%s failed: %w", ns, pod, errOr(t.err(), ErrPortForwardDied))
	case <-timer.C:
		t.close()
		return nil, fmt.Errorf("port-forward to pod %s/%s not ready after %s: %w", ns, pod, readyTimeout, ErrTimeout)
	case <-ctx.Done():
		t.close()
		return nil, ctx.Err()
	}
	fwd, err := fw.GetPorts()
	if err != nil || len(fwd) != len(ports) {
		t.close()
		return nil, fmt.Errorf("port-forward to pod %s/%s: local ports: %v", ns, pod, err)
	}
	for _, p := range fwd {
		t.local = append(t.local, int(p.Local))
	}
	return t, nil
}

func errOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
