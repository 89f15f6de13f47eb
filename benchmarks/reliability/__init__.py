"""The reliability suite's shared parts and its long trials (docs/reliability.md).

* `burst`: drive claim bursts that survive a control plane going away (creates retried, AlreadyExists
  after a lost response counted as created) and wait for them to settle;
* `invariants`: check what a burst left behind against the API server's audit log (no lost claim, no
  double binding, creates == replicas + refills + cold claims, no write from a deposed leader);
* `controllers`: start, SIGKILL and restart the controller, or run replicas with leader election, each
  with its own ServiceAccount token (so the audit log tells them apart);
* `churn`: claim create -> Ready -> delete cycles against the controller with a heap probe loaded
  (`churn_hook/sitecustomize.py`): allocation sites, allocator figures and map sizes between checkpoints;
* `crash`: one trial of SIGKILLs at random moments during a burst; `__main__` repeats it
  (`python -m benchmarks.reliability crash`), results as JSON in `benchmarks/results/`.

The quick, deterministic versions of the same checks run in CI (`tests/integration/reliability/`).
"""
