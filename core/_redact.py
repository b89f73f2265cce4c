"""The one redaction policy for every file agentcompact writes (event logs, debug dumps, logs).

A value is replaced by :data:`REDACTED` when its **key** names a secret, at any depth of
nested dicts and lists (lists of ``[name, value]`` header pairs included). Keys are compared
case-insensitively with ``-`` and ``_`` removed (``X-Api-Key`` = ``x_api_key`` = ``xapikey``).

A key is secret when, so normalised, it

* is one of :data:`SECRET_KEYS` — ``authorization``, ``proxyauthorization``, ``cookie``,
  ``setcookie``, ``credentials``, ``credential``, ``passwd``, ``password``, ``secret``,
  ``apikey``, ``xapikey``, ``privatekey``, ``accountid``, ...; or
* ends with one of :data:`SECRET_SUFFIXES` — ``apikey``, ``secret``, ``password``,
  ``passwd``, ``privatekey``, ``accesstoken``, ``refreshtoken``, ``idtoken``,
  ``sessiontoken``, ``authtoken``, ``bearertoken``, ``credentials``, ``accountid``
  (``client_secret``, ``OPENAI_API_KEY``, ``chatgpt_account_id``, ``aws_secret_access_key``
  is caught by ``secret`` anywhere: see below); or
* contains ``secret`` or ``password`` anywhere.

Counting fields such as ``max_tokens``, ``prompt_tokens``, ``prompt_token_ids`` or
``cached_tokens``, and the bare ``token`` of a logprob entry, are *not* secret: only the
exact token kinds above are. Values are never
inspected: a secret pasted into message text is data the agent saw and stays (redacting
it would change the tokens trained on); a secret in a structured field named as one is
removed. Redaction copies: the input is never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "SECRET_KEYS", "SECRET_SUFFIXES", "is_secret_key", "redact"]

REDACTED = "[redacted]"

SECRET_KEYS = frozenset({
    "authorization", "proxyauthorization", "cookie", "setcookie", "credentials",
    "credential", "passwd", "password", "secret", "apikey", "xapikey", "privatekey",
    "accountid", "xaccountid", "chatgptaccountid", "organizationid", "openaiorganization",
    "xgoogapikey", "anthropicapikey", "openaiapikey",
})
SECRET_SUFFIXES = (
    "apikey", "secret", "password", "passwd", "privatekey", "accesstoken", "refreshtoken",
    "idtoken", "sessiontoken", "authtoken", "bearertoken", "credentials", "accountid",
)
_ANYWHERE = ("secret", "password")
_SCALARS = frozenset({int, float, str, bool, type(None)})


def _normal(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


def is_secret_key(key: object) -> bool:
    """Whether a mapping key (or a header name) names a secret under this policy."""
    if not isinstance(key, str):
        return False
    k = _normal(key)
    return k in SECRET_KEYS or k.endswith(SECRET_SUFFIXES) or any(w in k for w in _ANYWHERE)


def redact(value: Any) -> Any:
    """A copy of ``value`` with every secret-keyed value replaced by :data:`REDACTED`.

    Dicts and lists are walked; a two-element list or tuple ``[name, value]`` whose name is
    a secret key (an HTTP header pair) has its value replaced. Anything else is returned
    as is (strings are immutable: no copy needed).
    """
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_key(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and is_secret_key(value[0]) and not isinstance(value[1], Mapping):
            items = [value[0], REDACTED]
        else:  # a scalar is returned as is: no call per token id of a 32k-token list
            items = [v if type(v) in _SCALARS else redact(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value
