"""The listener's serving pair followed on disk (controller-runtime's certwatcher).

cert-manager or a mounted Secret can rotate the certificate of a running webhook: :class:`CertWatcher` loads
the pair again when its files' bytes change, and new connections get the new pair while a pair that does not
load (half written, key and certificate from different rotations) keeps the previous one.
docs/design/webhook-cert-reload.md.
"""

from __future__ import annotations

import logging
import ssl
import tempfile
from pathlib import Path

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.controllers.webhook.errors import WebhookError

__all__ = ["CertWatcher", "server_context"]

# One logger name for every webhook module: operators filter on the field, and it predates the split.
log = logging.getLogger("agent_sandbox.controllers.webhook.server")


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """A TLS server context serving the pair in ``cert_path``/``key_path`` (TLS 1.2+, no client certificates).

    Raises:
        OSError: a file cannot be read (:class:`ssl.SSLError`, an ``OSError`` too: a file is no PEM, or the
            key does not match the certificate).
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # server side; no client certs requested
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


def _read_pair(cert_path: Path, key_path: Path) -> tuple[bytes, bytes] | str:
    """Both files' bytes, or why they cannot be read."""
    try:
        return cert_path.read_bytes(), key_path.read_bytes()
    except OSError as exc:
        return describe_error(exc)


def _context_of(pair: tuple[bytes, bytes]) -> ssl.SSLContext:
    """A server context of exactly these bytes (``load_cert_chain`` reads files: a private copy is loaded).

    Loading the watched files themselves read them a second time: a rotation landing between the comparison's
    read and the load served one pair while the watcher recorded another (until December 6).

    Raises:
        OSError: the bytes are no PEM pair, or the key does not match the certificate.
    """
    with tempfile.TemporaryDirectory(prefix="webhook-pair-") as private:  # mode 0700
        cert, key = Path(private) / "tls.crt", Path(private) / "tls.key"
        cert.write_bytes(pair[0])
        key.write_bytes(pair[1])
        return server_context(cert, key)


class CertWatcher:
    """The serving pair of a TLS listener, reloaded when its files change (controller-runtime's certwatcher).

    :attr:`context` is the context to give the listener. Its ``sni_callback`` runs for every new connection,
    SNI or not (the API server sends none for an IP address), and switches the connection to the context of
    the current pair, so connections made after a reload get the new certificate and open ones are left alone.

    :meth:`check` compares the files' bytes with those of the loaded pair: content, not mtimes, because a
    rotation through a Secret volume swaps a directory symlink and leaves the files' own names and times as
    they were, and a same-second rewrite can keep mtime and size. A changed pair that does not load (key and
    certificate from different rotations, a torn write) keeps the previous pair; it is retried on every check
    and reported once per distinct content that two checks in a row saw (a rotation replaces the two files one
    after the other: a check between the two renames sees a mismatched pair that is not worth a warning).
    The bytes compared are the bytes loaded (:func:`_context_of`).
    """

    def __init__(self, cert_path: Path, key_path: Path) -> None:
        """Load the pair.

        Raises:
            WebhookError: the files cannot be read or do not hold a matching certificate and key.
        """
        self.cert_path, self.key_path = cert_path, key_path
        loaded = _read_pair(cert_path, key_path)
        try:
            if isinstance(loaded, str):
                raise OSError(loaded)
            self._current = _context_of(loaded)
        except OSError as exc:
            raise WebhookError(
                f"webhook certificate {cert_path} and key {key_path} cannot be loaded: {describe_error(exc)}"
            ) from None
        self._loaded: tuple[bytes, bytes] | str = loaded  # what is served
        self._failed: tuple[bytes, bytes] | str | None = None  # the last check's content that did not load
        self._reported: tuple[bytes, bytes] | str | None = None
        self.reloads = 0
        self.context = self._current
        self.context.sni_callback = self._select

    @property
    def current(self) -> ssl.SSLContext:
        """The context of the most recently loaded pair."""
        return self._current

    def serves(self, cert_pem: bytes, key_pem: bytes) -> bool:
        """Whether the pair served to new connections is exactly these bytes (safe from any thread)."""
        return self._loaded == (cert_pem, key_pem)

    def _select(self, ssl_obj: ssl.SSLObject, _server_name: str | None, base: ssl.SSLContext) -> None:
        current = self._current
        if current is not base:
            ssl_obj.context = current

    def check(self) -> bool:
        """Load the pair again if its files changed; True when a new pair is now served."""
        seen = _read_pair(self.cert_path, self.key_path)
        if seen == self._loaded:
            return False
        try:
            if isinstance(seen, str):
                raise OSError(seen)
            fresh = _context_of(seen)
        except OSError as exc:
            # Said once per state, and only once two checks in a row saw it (not a rotation caught midway).
            settled, self._failed = seen == self._failed, seen
            if settled and seen != self._reported:
                self._reported = seen
                log.warning(
                    "webhook certificate %s / key %s changed but do not load; keeping the previous pair: %s",
                    self.cert_path,
                    self.key_path,
                    describe_error(exc),
                )
            return False
        self._current, self._loaded, self._failed, self._reported = fresh, seen, None, None
        self.reloads += 1
        log.info("reloaded webhook serving certificate from %s and %s", self.cert_path, self.key_path)
        return True
