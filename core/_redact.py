"""The one redaction policy for every file agentcompact writes (event logs, debug dumps, logs).

**Fields.** A value is replaced by :data:`REDACTED` when its **key** names a secret or an
identifier of an account or device, at any depth of nested dicts and lists (lists of
``[name, value]`` header pairs included). Keys are compared case-insensitively with ``-``
and ``_`` removed (``X-Api-Key`` = ``x_api_key`` = ``xapikey``). A key is secret when, so
normalised, it

* is one of :data:`SECRET_KEYS` — ``authorization``, ``proxyauthorization``, ``cookie``,
  ``setcookie``, ``credentials``, ``credential``, ``passwd``, ``password``, ``secret``,
  ``apikey``, ``xapikey``, ``privatekey``, ``accountid``, ``accountuuid``, ``deviceid``, ...; or
* ends with one of :data:`SECRET_SUFFIXES` — ``apikey``, ``secret``, ``password``,
  ``passwd``, ``privatekey``, ``accesstoken``, ``refreshtoken``, ``idtoken``,
  ``sessiontoken``, ``authtoken``, ``bearertoken``, ``credentials``, ``accountid``,
  ``accountuuid``, ``deviceid`` (``client_secret``, ``OPENAI_API_KEY``,
  ``chatgpt_account_id``; ``aws_secret_access_key`` is caught by ``secret`` anywhere: see
  below); or
* contains ``secret`` or ``password`` anywhere.

Counting fields such as ``max_tokens``, ``prompt_tokens``, ``prompt_token_ids`` or
``cached_tokens``, the bare ``token`` of a logprob entry and a thinking block's
``signature`` are *not* secret: only the exact kinds above are.

**Identifiers inside JSON strings.** A string under a key ending in ``id`` that holds a
JSON object (Claude Code's ``metadata.user_id``: ``{"device_id": …, "account_uuid": …,
"session_id": …}``) is read, redacted by the same rules and written back compactly: the
account and device ids go, the session id stays (it names the conversation, not a
person). The older ``user_<hash>_account_<uuid>_session_<uuid>`` form loses its account
part the same way.

**Headers** (:func:`redact_headers`, the ``--debug-dir`` dumps): besides the keys above,
any header whose name says ``auth``, ``key``, ``token``, ``secret``, ``cookie``,
``signature``, ``password`` or ``credential`` (:data:`SECRET_HEADER_WORDS`) — gateway
credentials such as ``cf-aig-authorization``, ``helicone-auth``,
``ocp-apim-subscription-key``, ``x-api-token``. Header names are a closed vocabulary of
the transport, so the broad rule costs nothing; body keys are not (a tool's ``--token``
argument, a logprob's ``token``), so bodies keep the exact rule.

Other values are never inspected: a secret pasted into message text is data the agent saw
and stays (redacting it would change the tokens trained on); a secret in a structured
field named as one is removed. Redaction copies: the input is never mutated.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["REDACTED", "SECRET_HEADER_WORDS", "SECRET_KEYS", "SECRET_SUFFIXES",
           "is_secret_header", "is_secret_key", "redact", "redact_headers"]

REDACTED = "[redacted]"

SECRET_KEYS = frozenset({
    "authorization", "proxyauthorization", "cookie", "setcookie", "credentials",
    "credential", "passwd", "password", "secret", "apikey", "xapikey", "privatekey",
    "accountid", "xaccountid", "chatgptaccountid", "organizationid", "openaiorganization",
    "xgoogapikey", "anthropicapikey", "openaiapikey", "accountuuid", "deviceid",
    "organizationuuid",
})
SECRET_SUFFIXES = (
    "apikey", "secret", "password", "passwd", "privatekey", "accesstoken", "refreshtoken",
    "idtoken", "sessiontoken", "authtoken", "bearertoken", "credentials", "accountid",
    "accountuuid", "deviceid",
)
SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie", "signature", "password",
                       "passwd", "credential")
_ANYWHERE = ("secret", "password")
_LEGACY_ACCOUNT = re.compile(r"(?<=_account_)[^_]+")
_SCALARS = frozenset({int, float, str, bool, type(None)})


def _normal(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


def is_secret_key(key: object) -> bool:
    """Whether a mapping key (or a header name) names a secret under this policy."""
    return isinstance(key, str) and _key_kind(key) == _SECRET


_SECRET, _ID, _PLAIN = 2, 1, 0


# The keys of a recorded call repeat (``role``, ``content``, ``type``… in every message,
# ``token`` and ``logprob`` in every logprob entry): their kind is computed once.
@functools.lru_cache(maxsize=4096)
def _key_kind(key: str) -> int:
    """:data:`_SECRET` for a secret key, :data:`_ID` for a key ending in ``id`` (its
    string value may carry identifiers), else :data:`_PLAIN`."""
    k = _normal(key)
    if k in SECRET_KEYS or k.endswith(SECRET_SUFFIXES) or any(w in k for w in _ANYWHERE):
        return _SECRET
    return _ID if k.endswith("id") else _PLAIN


def is_secret_header(name: object) -> bool:
    """Whether an HTTP header's value is a credential: a secret key, or a name saying one
    of :data:`SECRET_HEADER_WORDS` (``cf-aig-authorization``, ``helicone-auth``,
    ``ocp-apim-subscription-key``, ``x-api-token``…)."""
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    if not isinstance(name, str):
        return False
    k = _normal(name)
    return is_secret_key(name) or any(w in k for w in SECRET_HEADER_WORDS)


def redact(value: Any) -> Any:
    """A copy of ``value`` with every secret-keyed value replaced by :data:`REDACTED`, and
    the identifiers inside JSON strings under ``…id`` keys removed (module docstring).

    Dicts and lists are walked; a two-element list or tuple ``[name, value]`` whose name is
    a secret key (an HTTP header pair) has its value replaced. Anything else is returned
    as is (strings are immutable: no copy needed).
    """
    if isinstance(value, Mapping):
        return {k: _field(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and is_secret_key(value[0]) and not isinstance(value[1], Mapping):
            items = [value[0], REDACTED]
        elif _SCALARS.issuperset(map(type, value)):  # token ids, logprobs: at C speed
            items = list(value)
        else:  # a scalar is returned as is: no call per scalar
            items = [v if type(v) in _SCALARS else redact(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def redact_headers(headers: Any) -> dict[str, Any]:
    """HTTP headers (a mapping, or ``(name, value)`` pairs) as a dict with every credential
    value replaced by :data:`REDACTED` (:func:`is_secret_header`)."""
    pairs = headers.items() if isinstance(headers, Mapping) or hasattr(headers, "items") \
        else headers
    return {k: REDACTED if is_secret_header(k) else v for k, v in pairs}


def _field(key: Any, value: Any) -> Any:
    kind = _key_kind(key) if isinstance(key, str) else _PLAIN
    if kind == _SECRET:
        return REDACTED
    if kind == _ID and isinstance(value, str):
        return _ids_in(value)
    return value if type(value) in _SCALARS else redact(value)


def _ids_in(text: str) -> str:
    """``text`` with the account and device ids it carries removed: a JSON object redacted
    inside, the legacy ``…_account_<uuid>_…`` form's account part; other text as is."""
    if text.startswith("{") and text.endswith("}"):
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        if isinstance(parsed, dict):
            cleaned = redact(parsed)
            return text if cleaned == parsed else orjson.dumps(cleaned).decode()
        return text
    return _LEGACY_ACCOUNT.sub(REDACTED, text) if "_account_" in text else text
