package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Client creates and tracks sandboxes that share one set of options and Kubernetes clients.
type Client struct {
	opts Options
	k8s  *K8sHelper

	mu      sync.Mutex
	tracked map[Key]*Sandbox
	// opening are the handles whose CreateSandbox or GetSandbox is still opening them: DeleteAll and
	// EnableAutoCleanup close them too (which ends their Open and deletes the claim it made). Until December 6
	// a handle was tracked only once its Open had succeeded, so a Ctrl-C during creates leaked every claim.
	opening map[*Sandbox]struct{}
}

// deleteAllConcurrency is how many handles DeleteAll closes at a time.
const deleteAllConcurrency = 16

// NewClient validates opts (WarmPoolName may be empty here) and builds the Kubernetes clients.
func NewClient(ctx context.Context, opts Options) (*Client, error) {
	_ = ctx
	opts, k, err := prepare(opts)
	if err != nil {
		return nil, err
	}
	return &Client{opts: opts, k8s: k, tracked: map[Key]*Sandbox{}, opening: map[*Sandbox]struct{}{}}, nil
}

func (c *Client) optionsFor(warmPool, namespace string) (Options, error) {
	o := c.opts
	if warmPool != "" {
		o.WarmPoolName = warmPool
	}
	if namespace != "" {
		o.Namespace = namespace
		if c.opts.RouterNamespace == c.opts.Namespace {
			o.RouterNamespace = namespace
		}
	}
	o.ClaimName = ""
	if err := o.validate(); err != nil {
		return Options{}, fmt.Errorf("sandbox: %w", err)
	}
	return o, nil
}

// CreateSandbox claims a sandbox from warmPoolName in namespace ("" for the client's defaults), waits until
// it is Ready, connects, and tracks it. The handle is tracked from the start: a DeleteAll (or
// EnableAutoCleanup's signal) while it is being opened ends the Open - CreateSandbox then fails with
// ErrNotReady ("closed during Open") - and deletes the claim it made.
func (c *Client) CreateSandbox(ctx context.Context, warmPoolName, namespace string) (*Sandbox, error) {
	o, err := c.optionsFor(warmPoolName, namespace)
	if err != nil {
		return nil, err
	}
	sb := newSandbox(o, c.k8s)
	if err := c.open(ctx, sb, false); err != nil {
		return nil, err
	}
	return sb, nil
}

// open opens sb while it is among the opening handles (DeleteAll closes those too), and tracks it when the
// Open succeeds - or, with held, is held back (heldBack: GetSandbox returns such a handle) - and no DeleteAll
// took it meanwhile (that one closes it, or tracks it if its Close fails). Until December 6 GetSandbox
// tracked a held-back handle after this, so one a DeleteAll had taken and closed stayed tracked.
func (c *Client) open(ctx context.Context, sb *Sandbox, held bool) error {
	c.mu.Lock()
	c.opening[sb] = struct{}{}
	c.mu.Unlock()
	err := sb.Open(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, mine := c.opening[sb]
	delete(c.opening, sb)
	if mine && (err == nil || held && heldBack(sb, err)) {
		c.tracked[Key{Namespace: sb.opts.Namespace, ClaimName: sb.ClaimName()}] = sb
	}
	return err
}

// heldBack: err of sb's Open says its Sandbox is suspended or hibernated (attachHeld): sb is bound, not
// connected, and its calls say why (noConn); Resume or Open goes on from it.
func heldBack(sb *Sandbox, err error) bool {
	return errors.Is(err, ErrNotReady) && !errors.Is(err, errClosedDuringOpen) && sb.SandboxName() != "" && !sb.IsReady()
}

// GetSandbox returns a handle for an existing claim: the tracked handle if it is connected, otherwise a new
// one that waits (SandboxReadyTimeout) for the claim's Sandbox to be Ready and connects to it. The handle
// owns the claim by its UID (Close deletes that claim, never one re-created under the name since).
//
// A Sandbox that waiting will not make Ready comes back at once, as in the Python SDK: suspended, or
// hibernated (its SandboxArchive exists), GetSandbox returns the handle with a nil error - bound to the claim
// and Sandbox, not connected (IsReady false, not in ListActiveSandboxes), tracked (DeleteAll and
// EnableAutoCleanup Close it, deleting the claim). Its calls fail with ErrNotReady saying why and what to do
// ("is suspended ...: call Resume"; "is hibernated ...": how it is restored, which this SDK does not do -
// after a restore, Open connects the handle); Status says Suspended / Hibernated; Resume connects a
// suspended one. An expired archive is its *ConditionError SandboxExpired (ErrSandboxDeleted), without a
// handle, as is every other error. Until December 6 a suspended Sandbox ended in ErrTimeout after
// SandboxReadyTimeout and a hibernated one in ErrSandboxDeleted, both without a handle (and for a few hours
// of that day in the handle together with an ErrNotReady, which `if err != nil` callers never saw).
func (c *Client) GetSandbox(ctx context.Context, claimName, namespace string) (*Sandbox, error) {
	o, err := c.optionsFor("", namespace)
	if err != nil {
		return nil, err
	}
	key := Key{Namespace: o.Namespace, ClaimName: claimName}
	c.mu.Lock()
	sb := c.tracked[key]
	c.mu.Unlock()
	if sb != nil && sb.IsReady() {
		return sb, nil
	}
	if sb != nil {
		_ = sb.Disconnect(ctx)
	}
	if !isDNSSubdomain(claimName) {
		return nil, fmt.Errorf("sandbox: %w", invalidf("claim name %q is not a valid Kubernetes name", claimName))
	}
	sb = newSandbox(o, c.k8s)
	sb.claimName, sb.attach = claimName, true
	if err := c.open(ctx, sb, true); err != nil {
		if heldBack(sb, err) {
			// held back (suspended or hibernated): bound, tracked (open), and its calls say why; Resume or
			// Open goes on from this handle
			return sb, nil
		}
		return nil, err
	}
	return sb, nil
}

// ListActiveSandboxes returns the tracked sandboxes whose transport is connected, sorted.
func (c *Client) ListActiveSandboxes() []Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []Key
	for k, sb := range c.tracked {
		if sb.IsReady() {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Namespace != keys[j].Namespace {
			return keys[i].Namespace < keys[j].Namespace
		}
		return keys[i].ClaimName < keys[j].ClaimName
	})
	return keys
}

// ListAllSandboxes returns the names of all SandboxClaims in namespace ("" for the client's default).
func (c *Client) ListAllSandboxes(ctx context.Context, namespace string) ([]string, error) {
	if namespace == "" {
		namespace = c.opts.Namespace
	}
	list, err := c.k8s.claims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("sandbox: listing claims in %s: %w", namespace, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, item := range list.Items {
		names = append(names, item.GetName())
	}
	sort.Strings(names)
	return names, nil
}

// DeleteSandbox closes the tracked handle (which deletes its claim), or deletes the claim directly.
func (c *Client) DeleteSandbox(ctx context.Context, claimName, namespace string) error {
	if namespace == "" {
		namespace = c.opts.Namespace
	}
	key := Key{Namespace: namespace, ClaimName: claimName}
	c.mu.Lock()
	sb := c.tracked[key]
	c.mu.Unlock()
	if sb != nil {
		if err := sb.Close(ctx); err != nil {
			return err
		}
		c.mu.Lock()
		delete(c.tracked, key)
		c.mu.Unlock()
		return nil
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CleanupTimeout)
	defer cancel()
	if err := c.k8s.deleteClaim(dctx, namespace, claimName, ""); err != nil {
		return wrapErr(namespace, claimName, fmt.Errorf("deleting claim: %w", err))
	}
	return nil
}

// DeleteAll closes every tracked sandbox, and those a CreateSandbox or GetSandbox is still opening (their
// Open ends; see Close); it returns the failures joined (those stay tracked). The handles are closed
// together, 16 at a time, and share one drain: one-shot calls in flight may finish until half of
// CleanupTimeout after DeleteAll began, or ctx's deadline if that comes first (the claims are deleted after
// it all the same). Until December 6 they were closed one after another, each draining for up to half of
// CleanupTimeout: 30 busy handles took minutes, far past a Pod's 30 s termination grace period.
func (c *Client) DeleteAll(ctx context.Context) error {
	type entry struct {
		key     Key
		sb      *Sandbox
		opening bool
	}
	c.mu.Lock()
	all := make([]entry, 0, len(c.tracked)+len(c.opening))
	for k, sb := range c.tracked {
		all = append(all, entry{key: k, sb: sb})
	}
	for sb := range c.opening {
		all = append(all, entry{sb: sb, opening: true})
	}
	clear(c.opening) // this DeleteAll closes them: their CreateSandbox does not track them any more
	c.mu.Unlock()
	start := time.Now()
	errs := make([]error, len(all))
	sem := make(chan struct{}, deleteAllConcurrency)
	var wg sync.WaitGroup
	for i, e := range all {
		until := start.Add(e.sb.opts.CleanupTimeout / 2)
		if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
			until = dl
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = e.sb.close(ctx, until)
		}()
	}
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range all {
		switch {
		case errs[i] == nil && !e.opening && c.tracked[e.key] == e.sb:
			delete(c.tracked, e.key)
		case errs[i] != nil && e.opening:
			if name := e.sb.ClaimName(); name != "" { // kept, so a later DeleteAll retries
				c.tracked[Key{Namespace: e.sb.opts.Namespace, ClaimName: name}] = e.sb
			}
		}
	}
	return errors.Join(errs...)
}

// EnableAutoCleanup deletes all tracked sandboxes on SIGINT or SIGTERM (DeleteAll: also the handles a
// CreateSandbox is still opening, whose Open ends) and then re-raises the signal with its default action.
// The returned stop function removes the handler.
func (c *Client) EnableAutoCleanup() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case sig := <-ch:
			_ = c.DeleteAll(context.Background())
			signal.Stop(ch)
			signal.Reset(sig)
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Signal(sig)
			}
		case <-done:
		}
	}()
	return func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
	}
}
