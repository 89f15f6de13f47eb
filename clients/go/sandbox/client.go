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

	// mu is taken before a handle's own lock, never after: a handle calls the Client (reopen, closed) without
	// holding it.
	mu      sync.Mutex
	tracked map[Key]*Sandbox
	// keyOf is the key each tracked handle is tracked under (a re-opened handle moves to its new claim).
	keyOf map[*Sandbox]Key
	// pending are the handles whose CreateSandbox failed leaving claims of creates without an answer that could
	// not be looked for or deleted (no claim name to track them by): DeleteAll closes them, which repeats the
	// search. Until December 7 nothing kept them, and those claims leaked.
	pending map[*Sandbox]struct{}
	// opening are the handles whose CreateSandbox or GetSandbox - or an Open called on the handle (reopen) -
	// is still opening them: DeleteAll and
	// EnableAutoCleanup close them too (which ends their Open and deletes the claim it made). Until December 6
	// a handle was tracked only once its Open had succeeded, so a Ctrl-C during creates leaked every claim.
	opening map[*Sandbox]struct{}
	// getting are the GetSandbox attaches in progress, by key: a concurrent GetSandbox of the same claim waits
	// for that one and returns its handle. Until December 7 each made its own handle (and tunnel, for a
	// port-forward), one was tracked, and DeleteAll left the others connected.
	getting map[Key]*getFlight
	// onGetWait, when set (tests), is called as a GetSandbox starts waiting for another's attach.
	onGetWait func()
}

// getFlight is one GetSandbox attach that concurrent GetSandbox calls of the same key share.
type getFlight struct {
	done chan struct{} // closed when the fields below are set
	sb   *Sandbox
	err  error
	// callerGone: the attaching caller's context had ended (its failure is not the waiters')
	callerGone bool
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
	return &Client{opts: opts, k8s: k, tracked: map[Key]*Sandbox{}, keyOf: map[*Sandbox]Key{},
		pending: map[*Sandbox]struct{}{}, opening: map[*Sandbox]struct{}{}, getting: map[Key]*getFlight{}}, nil
}

// newSandbox is a handle of the Client: registered under its claim when an Open of it succeeds (also one
// called on the handle after Close, which claims a new sandbox), forgotten when a Close of it succeeds.
func (c *Client) newSandbox(o Options) *Sandbox {
	sb := newSandbox(o, c.k8s)
	sb.client = c
	return sb
}

// trackLocked tracks sb under key (c.mu held): its entry under another key goes, a handle tracked under key
// before is replaced.
func (c *Client) trackLocked(sb *Sandbox, key Key) {
	if old, ok := c.keyOf[sb]; ok && old != key && c.tracked[old] == sb {
		delete(c.tracked, old)
	}
	if prev := c.tracked[key]; prev != nil && prev != sb {
		delete(c.keyOf, prev)
	}
	c.tracked[key], c.keyOf[sb] = sb, key
	delete(c.pending, sb)
}

// untrackLocked forgets sb (c.mu held); a newer handle tracked under its key stays.
func (c *Client) untrackLocked(sb *Sandbox) {
	if k, ok := c.keyOf[sb]; ok {
		if c.tracked[k] == sb {
			delete(c.tracked, k)
		}
		delete(c.keyOf, sb)
	}
	delete(c.pending, sb)
}

// keepLocked keeps sb, whose Open or Close failed leaving a claim to delete, for DeleteAll to retry (c.mu
// held): tracked under its claim, or pending when its claim has no known name (creates without an answer) or
// another handle is tracked under it (a kept handle never replaces a different one: that one is the
// caller's, and DeleteAll closes both). What it keeps is what the handle owns and would delete: after a
// failed Open (closeFailed false) only what its cleanup could not delete (leftover) - a failed
// Client.GetSandbox, which returned no handle and whose attach left nothing to delete, is never kept (until
// this was checked DeleteAll deleted the claim of a GetSandbox whose readiness wait timed out - another
// program's - and the failed handle displaced the Client's own handle of that claim, whose claim leaked);
// after a failed Close by DeleteAll (closeFailed) also the claim the handle still owns (ownedClaim: an Open
// this Close could not end may still be using it).
func (c *Client) keepLocked(sb *Sandbox, closeFailed bool) {
	claim, left := sb.leftover()
	if !left && (!closeFailed || sb.ownedClaim() == "") {
		return
	}
	if claim != "" {
		key := Key{Namespace: sb.opts.Namespace, ClaimName: claim}
		if cur := c.tracked[key]; cur == nil || cur == sb {
			c.trackLocked(sb, key)
			return
		}
		c.untrackLocked(sb)
	}
	c.pending[sb] = struct{}{}
}

// reopen is an Open of sb, a handle of c, called on the handle itself (Sandbox.Open; a CreateSandbox or
// GetSandbox opens it with Client.open): the same bookkeeping as Client.open, so that the handle - usually
// re-opened after Close, claiming a new sandbox - is never out of the Client's sight. While it runs it is
// among the opening handles (DeleteAll and EnableAutoCleanup close it: the Open ends, "closed during Open",
// and its claim is deleted); when it succeeds it is tracked under its claim, unless another handle is
// tracked there (that one stays); when it fails leaving a claim to delete (ErrOrphanedClaim) it is kept for
// DeleteAll. Until December 7 such an Open was not among the opening handles - a DeleteAll during it missed
// it and its claim outlived EnableAutoCleanup - and an orphan it left was not kept.
func (c *Client) reopen(ctx context.Context, sb *Sandbox) error {
	c.mu.Lock()
	_, busy := c.opening[sb] // a Client.open of it is in progress: that one does the bookkeeping
	if !busy {
		c.opening[sb] = struct{}{}
	}
	c.mu.Unlock()
	err := sb.open(ctx)
	if busy {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, mine := c.opening[sb]; !mine {
		return err // a DeleteAll took it: that one closes it, and keeps it if its Close fails
	}
	delete(c.opening, sb)
	if err != nil {
		c.keepLocked(sb, false)
		return err
	}
	// the claim is read under c.mu: a Close that clears it after this calls closed, which waits for c.mu and
	// untracks the handle again
	if claim := sb.ClaimName(); claim != "" {
		key := Key{Namespace: sb.opts.Namespace, ClaimName: claim}
		if cur := c.tracked[key]; cur == nil || cur == sb {
			c.trackLocked(sb, key)
		}
	}
	return err
}

// closed: a Close of sb, a handle of c, succeeded - it owns nothing to delete any more - so c forgets it.
// Until December 7 the Client kept every handle closed with sb.Close (one entry per create/close cycle).
func (c *Client) closed(sb *Sandbox) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.untrackLocked(sb)
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
// ErrNotReady ("closed during Open") - and deletes the claim it made. A failed CreateSandbox whose cleanup
// failed too (ErrOrphanedClaim: the rollback could not delete the claim, or the claim of a create without an
// answer could not be looked for or deleted) returns no handle, but the Client keeps it: DeleteAll (and
// EnableAutoCleanup) retry the deletion. Until December 7 such a claim leaked.
func (c *Client) CreateSandbox(ctx context.Context, warmPoolName, namespace string) (*Sandbox, error) {
	o, err := c.optionsFor(warmPoolName, namespace)
	if err != nil {
		return nil, err
	}
	sb := c.newSandbox(o)
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
	err := sb.open(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, mine := c.opening[sb]
	delete(c.opening, sb)
	switch {
	case !mine:
	case err == nil || held && heldBack(sb, err):
		c.trackLocked(sb, Key{Namespace: sb.opts.Namespace, ClaimName: sb.ClaimName()})
	default:
		// a failed Open that left a claim to delete (ErrOrphanedClaim) is kept for DeleteAll: its caller got no
		// handle to Close (until December 7 nothing deleted that claim); a failed GetSandbox's claim is not
		// the Client's (keepLocked)
		c.keepLocked(sb, false)
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
	if !isDNSSubdomain(claimName) {
		return nil, fmt.Errorf("sandbox: %w", invalidf("claim name %q is not a valid Kubernetes name", claimName))
	}
	key := Key{Namespace: o.Namespace, ClaimName: claimName}
	for {
		c.mu.Lock()
		sb := c.tracked[key]
		if sb != nil && sb.IsReady() {
			c.mu.Unlock()
			return sb, nil
		}
		if f := c.getting[key]; f != nil {
			c.mu.Unlock()
			if c.onGetWait != nil {
				c.onGetWait()
			}
			select {
			case <-f.done:
			case <-ctx.Done():
				return nil, wrapErr(key.Namespace, key.ClaimName,
					callContextError(ctx, "get: waiting for another GetSandbox of the claim", nil))
			}
			if f.err != nil && f.callerGone && ctx.Err() == nil {
				continue // that caller's context ended its attach, not this one's: attach again
			}
			return f.sb, f.err
		}
		f := &getFlight{done: make(chan struct{})}
		c.getting[key] = f
		c.mu.Unlock()
		f.sb, f.err = c.attach(ctx, o, key, sb)
		f.callerGone = ctx.Err() != nil
		c.mu.Lock()
		delete(c.getting, key)
		c.mu.Unlock()
		close(f.done)
		return f.sb, f.err
	}
}

// attach is one GetSandbox's attach to key's claim (old: the tracked handle, not connected, or nil).
func (c *Client) attach(ctx context.Context, o Options, key Key, old *Sandbox) (*Sandbox, error) {
	if old != nil {
		_ = old.Disconnect(ctx)
	}
	sb := c.newSandbox(o)
	sb.claimName, sb.attach = key.ClaimName, true
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
		if c.tracked[key] == sb { // (Close's hook forgot a Client-made handle already)
			delete(c.tracked, key)
			delete(c.keyOf, sb)
		}
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

// DeleteAll closes every tracked sandbox, those a CreateSandbox or GetSandbox is still opening (their
// Open ends; see Close), and those whose CreateSandbox failed leaving a claim to delete (ErrOrphanedClaim);
// it returns the failures joined (those stay tracked). The handles are closed
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
	all := make([]entry, 0, len(c.tracked)+len(c.pending)+len(c.opening))
	for k, sb := range c.tracked {
		all = append(all, entry{key: k, sb: sb})
	}
	for sb := range c.pending {
		all = append(all, entry{sb: sb})
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
		case errs[i] == nil && e.key.ClaimName != "" && c.tracked[e.key] == e.sb:
			// (Close's hook forgot a Client-made handle already)
			delete(c.tracked, e.key)
			delete(c.keyOf, e.sb)
		case errs[i] == nil && e.key.ClaimName == "" && !e.opening:
			delete(c.pending, e.sb)
		case errs[i] != nil && e.opening:
			c.keepLocked(e.sb, true) // so a later DeleteAll retries
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
