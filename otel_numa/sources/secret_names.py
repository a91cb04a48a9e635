"""Which names may hold a secret, and credentials taken out of URL-shaped values.

The rule, for environment variable names, pod label keys and pod annotation keys alike:

1. Fold the name: Unicode NFKD with combining marks dropped (``PÁSSWORD`` -> ``PASSWORD``, full-width and
   other compatibility forms -> ASCII), then Greek and Cyrillic letters that look like Latin ones to those
   (``TOKEN`` spelt with a Greek capital Tau -> ``TOKEN``), then upper case.
2. Split it into words at every character other than a letter or digit and where a lower-case letter meets
   an upper-case one (``githubPat`` -> ``GITHUB``, ``PAT``).
3. It is secret-like when the words, joined without separators, contain one of :data:`SECRET_FRAGMENTS`
   (``DB_PASS_WORD`` too), or when one word is one of :data:`SECRET_WORDS` (short words that are also parts
   of ordinary ones: ``PAT`` but not ``PATH``).

The rule errs on the side of refusing: ``AUTHOR`` or ``PRIVILEGED`` are refused too. A refused name is never
read out, allowlisted or not.
"""

from __future__ import annotations

import re
import unicodedata

SECRET_FRAGMENTS = (
    "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PWD",
    "SECRET", "TOKEN", "KEY", "CREDENTIAL", "CRED",
    "AUTH", "BEARER", "JWT", "COOKIE",
    "PRIV", "HMAC", "SALT", "SIGNING",
    "DSN", "CONNECTIONSTRING", "CONNSTR",
    "KUBECONFIG", "WEBHOOK", "ROLEID", "SECRETID",
)  # fmt: skip
SECRET_WORDS = frozenset({"PAT", "PEM", "OTP", "PIN", "SIG"})

# Letters of other scripts drawn like Latin ones (the common part of Unicode's confusables), and those.
_GREEK = "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧαεικνορτυχϲϳ", "ABEZHIKMNOPTYXaeikvoptuxcj"
_CYRILLIC = "АВЕЅІЈКМНОРСТУХаеіјорсухѕԁԛԝ", "ABESIJKMHOPCTYXaeijopcyxsdqw"  # noqa: RUF001
_LATIN_ODD = "ıſ", "is"  # noqa: RUF001  dotless i, long s
_LOOK_ALIKES = str.maketrans(*("".join(column) for column in zip(_GREEK, _CYRILLIC, _LATIN_ODD, strict=True)))
_NOT_ALNUM = re.compile(r"[^0-9A-Za-z]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# scheme://userinfo@ : the userinfo (user, or user:password) goes, the rest of the URL stays
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\s?#@]*(?:@[^/\s?#@]*)*@")


def fold(name: str) -> str:
    """``name`` in plain upper-case ASCII letters where it was written with look-alikes."""
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(character for character in decomposed if not unicodedata.combining(character))
    return plain.translate(_LOOK_ALIKES)


def words(name: str) -> list[str]:
    """The upper-case words of a folded name."""
    spaced = _CAMEL.sub("_", fold(name))
    return [word for word in _NOT_ALNUM.split(spaced.upper()) if word]


def is_secret_like(name: str) -> bool:
    """True for a name that may hold a secret; its value is never read out."""
    parts = words(name)
    if not parts:
        return False
    joined = "".join(parts)
    return any(fragment in joined for fragment in SECRET_FRAGMENTS) or any(
        part in SECRET_WORDS for part in parts
    )


def without_url_credentials(value: str) -> str:
    """``value`` with the user and password of every ``scheme://user:password@host`` in it taken out."""
    return _URL_USERINFO.sub(r"\1", value)
