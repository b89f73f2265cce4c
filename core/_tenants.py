"""Tenants: whose compactions, archived originals and handles they are.

Several users sharing one proxy and one store (a Redis server, a SQLite file) must not
reach each other's dropped originals. Everything they share is scoped by a **tenant**,
derived from what authenticates a request — the API key (``x-api-key``, the token of
``authorization``) or a header a gateway sets (``--tenant-header``) — by a keyed hash, so
neither the secret nor anything that would let one be checked is stored or logged:

* ``root = HMAC-SHA256(secret, material)``: ``secret`` is the deployment's
  ``AGENTCOMPACT_TENANT_SECRET`` when set (then even a guessable header value such as
  ``team-a`` gives ids and handles no one can compute without it), else a fixed
  domain-separation key (an API key's own entropy protects it);
* ``Tenant.id`` — 16 hex digits of ``HMAC(root, "tenant id")``: names the tenant in store
  keys, session keys and logs;
* ``Tenant.handle_key`` — ``HMAC(root, "handles")``: the key of the tenant's handles
  (``handle_of(text, key)``, a keyed BLAKE2b), so a handle reveals nothing about its text
  and names something only inside its tenant.

:data:`SINGLE_TENANT` (id ``""``, unkeyed handles) is the tenant of a store one person
uses: the archive and keys laid out as before tenancy existed.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

__all__ = ["SINGLE_TENANT", "Tenant", "tenant_of"]

_DOMAIN = b"agentcompact tenant v1"


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant: ``id`` scopes keys (``""``: the single tenant), ``handle_key`` keys its
    handles (``None``: unkeyed content digests)."""

    id: str
    handle_key: bytes | None = None

    def __repr__(self) -> str:  # the key never goes into a log line or a traceback
        return f"Tenant({self.id!r})"


SINGLE_TENANT = Tenant("")
"""The tenant of a store one person uses (no scope, unkeyed handles)."""


def tenant_of(material: str | bytes, secret: str | bytes | None = None) -> Tenant:
    """The tenant whose credential (or tenant header value) is ``material``.

    :param secret: the deployment's tenant secret (``AGENTCOMPACT_TENANT_SECRET``); every
        replica and ``agentcompact mcp`` must be given the same one.
    """
    data = material.encode("utf-8", "surrogatepass") if isinstance(material, str) else material
    key = secret.encode() if isinstance(secret, str) else secret
    root = hmac.new(key or _DOMAIN, data, hashlib.sha256).digest()
    tenant_id = hmac.new(root, b"tenant id", hashlib.sha256).hexdigest()[:16]
    return Tenant(tenant_id, hmac.new(root, b"handles", hashlib.sha256).digest())
