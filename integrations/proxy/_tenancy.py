"""Which tenant a request belongs to (``agentcompact._tenants``), from its headers.

``credential`` (a proxy on a shared store): the request's API key — ``x-api-key``, the
token of ``authorization`` (its scheme, ``Bearer``, left out: the same key sent either
way is one tenant), ``api-key`` (Azure), ``x-goog-api-key``; no credential at all is one
anonymous tenant. ``header`` (``--tenant-header NAME``): the value of a header a gateway
in front sets after authenticating the user (when several users share one provider key);
a request without it falls back to its credential. ``single``: one person's proxy, every
request one tenant. ``auto`` is ``single`` on the default store (a private file in the
user's state folder) or a ``memory`` store, and ``credential`` once a store or archive is
given (a store others may share).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agentcompact import SINGLE_TENANT, Tenant, tenant_of
from agentcompact.errors import ConfigError

__all__ = ["CREDENTIAL_HEADERS", "TENANCIES", "Tenancy"]

#: where a request's credential is, in order
CREDENTIAL_HEADERS = ("x-api-key", "authorization", "api-key", "x-goog-api-key")
TENANCIES = ("auto", "credential", "single")
_CACHED = 1024  # credentials whose tenant is kept (two HMACs each, saved per request)


@dataclass
class Tenancy:
    """The proxy's tenancy: ``mode`` (``single``, ``credential``, ``header``), the tenant
    header's name, and the deployment's secret (never in ``repr``)."""

    mode: str
    header: str | None = None
    secret: str | None = field(default=None, repr=False)
    _known: dict[str, Tenant] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, tenancy: str, header: str | None, secret: str | None, *,
           shared_store: bool) -> Tenancy:
        """The tenancy a configuration asks for (``shared_store``: a store or archive was
        given, so ``auto`` scopes by credential)."""
        if tenancy not in TENANCIES:
            raise ConfigError(f"--tenancy must be one of {', '.join(TENANCIES)}, got "
                              f"{tenancy!r}")
        if header is not None and (not header.strip() or tenancy == "single"):
            raise ConfigError("--tenant-header needs a header name, and cannot go with "
                              "--tenancy single")
        if header is not None:
            return cls("header", header.strip().lower(), secret)
        if tenancy == "credential" or (tenancy == "auto" and shared_store):
            return cls("credential", None, secret)
        return cls("single", None, secret)

    def tenant(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant of a request with these headers (names as any case: a Starlette
        ``Headers`` or a lower-case dict)."""
        if self.mode == "single":
            return SINGLE_TENANT
        material = headers.get(self.header) if self.header else None
        if not material:
            material = credential_of(headers)
        found = self._known.get(material)
        if found is None:
            if len(self._known) >= _CACHED:
                self._known.clear()
            found = self._known[material] = tenant_of(material, self.secret)
        return found


def credential_of(headers: Mapping[str, str]) -> str:
    """The request's credential (``""``: none): the first of :data:`CREDENTIAL_HEADERS`,
    an ``authorization`` value without its scheme."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            if name == "authorization":
                scheme, _, token = value.strip().partition(" ")
                return token.strip() or scheme
            return value.strip()
    return ""
