"""Bearer authentication in front of ``/mcp``: the subject comes from here and nowhere else.

Two authenticators:

- :class:`TokenFileAuthenticator`: a file of SHA-256 hex digests of opaque bearer tokens mapped to
  subject ids (no plaintext token at rest). The presented token is hashed and compared with every
  entry in constant time. The file is re-read when it changes (token rotation without a restart).
- :class:`JWTAuthenticator`: a signed JWT (RS*/PS*/ES*/EdDSA only, never ``none`` or HMAC) checked
  against a JWKS from a file or an https URL, with the configured issuer and audience; ``iat``,
  ``exp`` and ``sub`` are required, ``exp - iat`` is at most ``max_lifetime`` (a token that lives
  for ever is a credential that cannot be revoked), and ``sub`` is the subject id.

:class:`BearerAuthMiddleware` is pure ASGI (streaming responses pass straight through). A request
without a valid token gets ``401`` with ``WWW-Authenticate: Bearer`` and never reaches the MCP
application; a valid one runs inside ``codemode.authz.with_subject(subject)`` so that
``codemode.mcp.ContextSubject()`` sees it. Tokens are never logged, stored or put into the subject.

Create a token for the token file with ``python -m codemode.service.tokens new SUBJECT --file FILE``
(prints the token once; writes only its hash).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import authz
from ..startup.config import ConfigError, Settings
from .responses import plain_json
from .tokens import hash_token, load_token_file, valid_subject

__all__ = [
    "MAX_JWKS_BYTES",
    "MAX_TOKEN_BYTES",
    "UNAUTHENTICATED_BODY",
    "AuthFailure",
    "Authenticator",
    "BearerAuthMiddleware",
    "FailureHook",
    "JWTAuthenticator",
    "TokenFileAuthenticator",
    "build_authenticator",
    "hash_token",
    "load_token_file",
]

log = logging.getLogger("codemode.service.auth")

_HEX64_ANYWHERE = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")

#: Bytes of a bearer token read from a request (a longer one fails as malformed).
MAX_TOKEN_BYTES = 8 * 1024
#: Bytes of a JWKS document, read from its file or URL.
MAX_JWKS_BYTES = 1024 * 1024
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class AuthFailure(Exception):
    """Authentication failed; ``reason`` is a short, non-secret label for logs and metrics.

    Args:
        reason: the label (``unknown_token``, ``expired``, ...).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Authenticator(Protocol):
    """What :class:`BearerAuthMiddleware` asks about each request's bearer token."""

    async def authenticate(self, token: str) -> authz.Subject:
        """The subject the token proves.

        Args:
            token: the bearer token.

        Returns:
            The trusted subject.

        Raises:
            AuthFailure: the token proves nothing (the reason says why, for logs and metrics).
        """
        ...


# --------------------------------------------------------------------------------------------------
# Token file
# --------------------------------------------------------------------------------------------------


class TokenFileAuthenticator:
    """Opaque bearer tokens checked against a file of their SHA-256 digests (compared in constant
    time over every entry; the file is re-read when it changes).

    Args:
        path: the token file.
        reload_interval: seconds between checks of the file for changes.
    """

    def __init__(self, path: Path, *, reload_interval: float = 1.0) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self._entries: list[tuple[bytes, str]] = []
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self._missing = False
        self._load()

    def _file_stamp(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> None:
        stamp = self._file_stamp()
        entries = load_token_file(self.path)
        self._entries = [(bytes.fromhex(d), s) for d, s in entries.items()]
        self._stamp = stamp
        self._checked = time.monotonic()

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.reload_interval:
            return
        self._checked = now
        try:
            stamp = self._file_stamp()
        except OSError as exc:
            # Deleted (or unreadable): fail closed. Revoking every token must not need a restart.
            self._entries = []
            self._stamp = None
            if not self._missing:
                self._missing = True
                log.error(
                    "token file %s is gone (%s): no token is accepted until it is back",
                    self.path,
                    exc.strerror or type(exc).__name__,
                )
            return
        if stamp == self._stamp:
            return
        try:
            self._load()
            self._missing = False
            log.info("token file reloaded: %d entries", len(self._entries))
        except FileNotFoundError:
            self._checked = 0.0  # replaced between stat and read: look again on the next request
        except (OSError, ConfigError) as exc:
            # A half-written or mistyped file must not lock everybody out, nor keep a revoked token
            # alive: keep only the previous tokens whose hash is still in the file.
            try:
                present = set(
                    _HEX64_ANYWHERE.findall(self.path.read_text(encoding="utf-8", errors="replace").lower())
                )
            except OSError:
                present = set()
            before = len(self._entries)
            self._entries = [(d, s) for d, s in self._entries if d.hex() in present]
            log.error(
                "token file reload failed (%s): keeping %d of %d previous tokens, those still listed",
                exc,
                len(self._entries),
                before,
            )

    async def authenticate(self, token: str) -> authz.Subject:
        self._maybe_reload()
        digest = hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).digest()
        found: str | None = None
        for stored, subject in self._entries:
            # No early exit: the time taken does not depend on which entry (if any) matched.
            if hmac.compare_digest(stored, digest):
                found = subject
        if found is None:
            raise AuthFailure("unknown_token")
        return authz.Subject(found)


# --------------------------------------------------------------------------------------------------
# JWT against a JWKS
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    jwk: jwt.PyJWK
    kid: str | None
    kty: str
    alg: str | None


class _KeySet:
    """Public signature keys from a JWKS document."""

    def __init__(self, document: Any) -> None:
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise ConfigError("jwks: not a JWKS document (an object with a 'keys' array)")
        self.keys: list[_Key] = []
        for raw in document["keys"]:
            if not isinstance(raw, dict) or raw.get("use", "sig") != "sig":
                continue
            if any(k in raw for k in ("d", "p", "q", "k")):
                # A private or symmetric key has no business in a verification key set.
                log.warning("jwks: ignoring a key that carries private or symmetric material")
                continue
            kid, alg, kty = raw.get("kid"), raw.get("alg"), raw.get("kty")
            if not isinstance(kty, str) or not (kid is None or isinstance(kid, str)):
                continue
            if alg is not None and not isinstance(alg, str):
                continue
            try:
                self.keys.append(_Key(jwt.PyJWK(raw), kid, kty, alg))
            except jwt.PyJWTError as exc:
                log.warning("jwks: ignoring an unusable key: %s", exc)
        if not self.keys:
            raise ConfigError("jwks: no usable signature keys")

    def find(self, kid: str | None, alg: str) -> _Key | None:
        """The key a token with this header names: by ``kid``, or the only fitting key without one."""
        fitting = [k for k in self.keys if _alg_fits(k, alg) and (kid is None or k.kid == kid)]
        if kid is None and len(fitting) != 1:
            return None
        return fitting[0] if fitting else None


_FAMILIES = {"RSA": ("RS", "PS"), "EC": ("ES",), "OKP": ("EdDSA",)}


def _alg_fits(key: _Key, alg: str) -> bool:
    if key.alg is not None and key.alg != alg:
        return False
    return any(alg.startswith(prefix) for prefix in _FAMILIES.get(key.kty, ()))


class JWTAuthenticator:
    """JWTs signed by a key of a configured JWKS, for one issuer and audience (``iat``, ``exp``,
    ``iss``, ``aud`` and ``sub`` required; ``exp - iat`` at most ``max_lifetime``; ``sub`` must be a
    valid subject id).

    Args:
        issuer: the required ``iss``.
        audience: the required ``aud``.
        algorithms: the signing algorithms accepted.
        jwks_file: the key set's file (exactly one of this and ``jwks_url``).
        jwks_url: the key set's URL.
        leeway: seconds of clock skew allowed on ``exp``/``nbf``/``iat``.
        max_lifetime: the most seconds from ``iat`` to ``exp`` (a longer-lived token is refused as
            ``lifetime_too_long``).
        cache_seconds: seconds a key set is kept before it is read again.
        min_refresh_interval: least seconds between reads forced by an unknown key id.
        fetch_timeout: seconds a URL fetch may take.

    Raises:
        ConfigError: not exactly one of ``jwks_file`` and ``jwks_url``, or the file is unusable.
    """

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        algorithms: list[str],
        jwks_file: Path | None = None,
        jwks_url: str | None = None,
        leeway: float = 30.0,
        max_lifetime: float = 86400.0,
        cache_seconds: float = 300.0,
        min_refresh_interval: float = 30.0,
        fetch_timeout: float = 5.0,
    ) -> None:
        if (jwks_file is None) == (jwks_url is None):
            raise ConfigError("jwt: exactly one of jwks_file and jwks_url")
        self.issuer = issuer
        self.audience = audience
        self.algorithms = list(algorithms)
        self.jwks_file = jwks_file
        self.jwks_url = jwks_url
        self.leeway = leeway
        self.max_lifetime = max_lifetime
        self.cache_seconds = cache_seconds
        self.min_refresh_interval = min_refresh_interval
        self.fetch_timeout = fetch_timeout
        self._keys: _KeySet | None = None
        self._loaded_at = 0.0
        self._file_stamp: tuple[int, int] | None = None
        self._lock = asyncio.Lock()
        if jwks_file is not None:
            self._load_file()

    # ------------------------------------------------------------------ key material
    def _load_file(self) -> None:
        assert self.jwks_file is not None
        try:
            st = os.stat(self.jwks_file)
            raw = self.jwks_file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"jwks_file: cannot read {str(self.jwks_file)!r}: {exc.strerror}") from None
        if len(raw) > MAX_JWKS_BYTES:
            raise ConfigError("jwks_file: larger than 1 MiB")
        try:
            document = json.loads(raw)
        except ValueError:
            raise ConfigError(f"jwks_file: {str(self.jwks_file)!r} is not JSON") from None
        self._keys = _KeySet(document)
        self._file_stamp = (st.st_mtime_ns, st.st_size)
        self._loaded_at = time.monotonic()

    async def _fetch_url(self) -> None:
        import httpx

        assert self.jwks_url is not None
        body = bytearray()
        async with (
            httpx.AsyncClient(timeout=self.fetch_timeout, follow_redirects=False) as client,
            client.stream("GET", self.jwks_url, headers={"Accept": "application/json"}) as resp,
        ):
            if resp.status_code != 200:
                raise ConfigError(f"jwks_url: HTTP {resp.status_code}")
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ConfigError("jwks_url: document larger than 1 MiB")
        try:
            document = json.loads(bytes(body))
        except ValueError:
            raise ConfigError("jwks_url: response is not JSON") from None
        self._keys = _KeySet(document)
        self._loaded_at = time.monotonic()

    async def refresh(self, *, force: bool = False) -> None:
        """Re-read the key set if it is stale (or ``force``), at most once per ``min_refresh_interval``
        when forced by an unknown key id. A failed re-read keeps the previous keys (logged).

        Args:
            force: read it even if it is not stale (an unknown key id).

        Raises:
            AuthFailure: ``jwks_unavailable``: the URL cannot be fetched and no keys were ever read.
        """
        if not force and self._keys is not None and time.monotonic() - self._loaded_at < self.cache_seconds:
            return
        async with self._lock:
            age = time.monotonic() - self._loaded_at
            if self._keys is not None:
                if force and age < self.min_refresh_interval:
                    return
                if not force and age < self.cache_seconds:
                    return
            if self.jwks_file is not None:
                try:
                    st = os.stat(self.jwks_file)
                    if self._keys is not None and (st.st_mtime_ns, st.st_size) == self._file_stamp:
                        self._loaded_at = time.monotonic()
                        return
                except OSError:
                    pass
                try:
                    self._load_file()
                except ConfigError as exc:
                    self._loaded_at = time.monotonic()
                    log.error("jwks reload failed, keeping the previous keys: %s", exc)
                return
            try:
                await self._fetch_url()
            except Exception as exc:  # network errors, bad documents
                self._loaded_at = time.monotonic() if self._keys is not None else 0.0
                log.error("jwks fetch failed: %s", _short(exc))
                if self._keys is None:
                    raise AuthFailure("jwks_unavailable") from None

    async def start(self) -> None:
        """Load the key set eagerly (a URL is fetched here; failure is logged, retried on demand)."""
        with contextlib.suppress(AuthFailure):
            await self.refresh()

    # ------------------------------------------------------------------ tokens
    async def authenticate(self, token: str) -> authz.Subject:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthFailure("malformed_token") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise AuthFailure("algorithm_not_allowed")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthFailure("malformed_token")
        await self.refresh()
        assert self._keys is not None
        key = self._keys.find(kid, alg)
        if key is None:
            await self.refresh(force=True)
            key = self._keys.find(kid, alg)
            if key is None:
                raise AuthFailure("unknown_key")
        try:
            claims = jwt.decode(
                token,
                key=key.jwk.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["iat", "exp", "iss", "aud", "sub"], "verify_signature": True},
            )
        except jwt.ExpiredSignatureError:
            raise AuthFailure("expired") from None
        except jwt.InvalidAudienceError:
            raise AuthFailure("wrong_audience") from None
        except jwt.InvalidIssuerError:
            raise AuthFailure("wrong_issuer") from None
        except jwt.MissingRequiredClaimError:
            raise AuthFailure("missing_claim") from None
        except jwt.InvalidSignatureError:
            raise AuthFailure("bad_signature") from None
        except jwt.PyJWTError:
            raise AuthFailure("invalid_token") from None
        # PyJWT checked that both are integers (``int()`` accepts them) and iat is not in the future.
        if int(claims["exp"]) - int(claims["iat"]) > self.max_lifetime:
            raise AuthFailure("lifetime_too_long")
        sub = claims.get("sub")
        if not isinstance(sub, str) or not valid_subject(sub):
            # The token-file rule: printable, no surrounding spaces, 1-256 characters.
            raise AuthFailure("invalid_subject")
        return authz.Subject(sub)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}"


def build_authenticator(settings: Settings) -> TokenFileAuthenticator | JWTAuthenticator:
    """The authenticator the settings describe.

    Args:
        settings: the service settings (``auth_mode`` and its fields).

    Returns:
        A token-file or a JWT authenticator.
    """
    if settings.auth_mode == "token_file":
        return TokenFileAuthenticator(settings.token_file_path)
    assert settings.jwt_issuer is not None and settings.jwt_audience is not None
    return JWTAuthenticator(
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        algorithms=settings.jwt_algorithms,
        jwks_file=settings.jwks_file,
        jwks_url=settings.jwks_url,
        leeway=settings.jwt_leeway_seconds,
        max_lifetime=settings.jwt_max_lifetime_seconds,
        cache_seconds=settings.jwks_cache_seconds,
    )


# --------------------------------------------------------------------------------------------------
# ASGI middleware
# --------------------------------------------------------------------------------------------------

#: Called with the failure's reason and the request's scope when a request is refused.
FailureHook = Callable[[str, Scope], None]


def _bearer_token(scope: Scope) -> tuple[str | None, str]:
    """(token, reason): the token, or None with why not."""
    values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
    if not values:
        return None, "missing_token"
    if len(values) > 1:
        return None, "malformed_header"
    raw = values[0]
    if len(raw) > MAX_TOKEN_BYTES + 7:
        return None, "malformed_header"
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None, "malformed_header"
    scheme, _, token = text.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None, "malformed_header"
    return token, ""


class BearerAuthMiddleware:
    """Pure ASGI: authenticate, then run the wrapped app inside ``with_subject(subject)``. A request
    without a valid token gets 401 with :data:`UNAUTHENTICATED_BODY` and a ``WWW-Authenticate``
    challenge; a websocket is closed (1008).

    Args:
        app: the wrapped app.
        authenticator: checks each token.
        realm: the challenge's realm.
        on_failure: told about each refused request.
        on_success: told about each authenticated one.
        gate: asked after authentication; False answers 503 (shutting down).
    """

    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator,
        *,
        realm: str = "codemode",
        on_failure: FailureHook | None = None,
        on_success: Callable[[authz.Subject], bool] | None = None,
        gate: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.realm = realm
        self.on_failure = on_failure
        self.on_success = on_success
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            # Only HTTP reaches /mcp; anything else (websocket) is refused outright.
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        token, reason = _bearer_token(scope)
        subject: authz.Subject | None = None
        if token is not None:
            try:
                subject = await self.authenticator.authenticate(token)
            except AuthFailure as exc:
                reason = exc.reason
            except Exception as exc:
                log.error("authenticator failed: %s", type(exc).__name__)
                reason = "authenticator_error"
            if subject is not None and (not isinstance(subject, authz.Subject) or not subject.id):
                subject, reason = None, "invalid_subject"
        del token
        if subject is None:
            if self.on_failure is not None:
                try:
                    self.on_failure(reason, scope)
                except Exception:
                    log.exception("auth failure hook failed")
            await self._unauthorized(send, invalid=reason != "missing_token")
            return
        if self.on_success is not None and not self.on_success(subject):
            # The subject holds every connection it may (codemode.service.edge): this one closes.
            headers = [(b"retry-after", b"1"), (b"connection", b"close")]
            await plain_json(send, 429, {"error": "too many connections"}, headers)
            return
        if self.gate is not None and not await self.gate():
            await plain_json(send, 503, {"error": "shutting down"}, [(b"retry-after", b"1")])
            return
        scope["user"] = _sdk_user(subject)
        with authz.with_subject(subject):
            await self.app(scope, receive, send)

    async def _unauthorized(self, send: Send, *, invalid: bool) -> None:
        challenge = f'Bearer realm="{self.realm}"'
        if invalid:
            challenge += ', error="invalid_token"'
        await plain_json(send, 401, UNAUTHENTICATED_BODY, [(b"www-authenticate", challenge.encode("ascii"))])


#: A JSON-RPC error, so an MCP client shows the reason: the official SDK turns a non-2xx JSON-RPC
#: error body into the error of the request it answers (``MCPError: unauthenticated``); a plain body
#: would be "Server returned an error response". The id is null: the body is not read before
#: authentication, and the SDK puts the request's own id in its place.
UNAUTHENTICATED_BODY: dict[str, object] = {
    "jsonrpc": "2.0",
    "id": None,
    "error": {"code": -32001, "message": "unauthenticated"},
}


def _sdk_user(subject: authz.Subject) -> Any:
    """The SDK's authenticated-user object, so a stateful MCP session is bound to the subject that
    opened it (the SDK answers 404 to a different subject presenting that session id). It carries
    the subject id only, never the token."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(AccessToken(token="", client_id=subject.id, scopes=[], subject=subject.id))
