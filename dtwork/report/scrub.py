"""Secret scrubbing for reports: secrets become ``<scrubbed>``, code stays code.

The catalogue of secret shapes is detect-secrets' (its detectors' patterns, matched here by
position and without its process-wide settings), completed by the shapes it lacks (Google API keys, Stripe test keys,
whole PEM blocks, JWT signatures, URL credentials, ``--password x`` flags), by values assigned to
secret-looking names, and by the values of the secret-looking variables of the kernel's
environment, which an exporter is handed rather than reading its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from detect_secrets.filters.heuristic import is_potential_uuid, is_sequential_string, is_templated_secret
from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP, KeywordDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

__all__ = ["ENV_NAME", "SCRUBBED", "Scrubber", "secret_environ"]

SCRUBBED = "<scrubbed>"
ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
MIN_ENV_VALUE = 8  # shorter values ("1", "true") would scrub ordinary text

# detect-secrets' high-entropy detectors are left out: they flag every hash, UUID and path.
_DETECTORS: tuple[type[BasePlugin], ...] = (
    ArtifactoryDetector,
    AWSKeyDetector,
    AzureStorageKeyDetector,
    CloudantDetector,
    DiscordBotTokenDetector,
    GitHubTokenDetector,
    GitLabTokenDetector,
    IbmCloudIamDetector,
    IbmCosHmacDetector,
    JwtTokenDetector,
    KeywordDetector,
    MailchimpDetector,
    NpmDetector,
    OpenAIDetector,
    PypiTokenDetector,
    SendGridDetector,
    SlackDetector,
    SoftlayerDetector,
    SquareOAuthDetector,
    StripeDetector,
    TelegramBotTokenDetector,
    TwilioKeyDetector,
)

_WORD = r"token(?!iz)|secret|passw(?:or)?d|pwd|credential|auth(?!or)|api_?key|access_?key|private_?key"
_SECRET_KEY = re.compile(rf"(?i)(?:{_WORD})|(?:^|[_.-])keys?$")
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
_TOKEN = re.compile(  # shapes detect-secrets lacks: Hugging Face, OpenAI's new keys, Google, Stripe test
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[\w-]{20,}|AIza[0-9A-Za-z_-]{35}|sk_test_[0-9A-Za-z]{16,}"
    r"|eyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]*)"  # a whole JWT: detect-secrets' match stops before the signature
)
_URL_PASSWORD = re.compile(r"\b[A-Za-z][\w+.-]*://[^\s:/?#@'\"]+:(?P<v>[^\s/?#@'\"]+)@")
_FLAG = re.compile(
    r"(?i)(?<![\w-])(?P<name>--?[\w-]*(?:token(?!iz)|secret|passw(?:or)?d|pwd|api-?key|access-?key)[\w-]*)"
    r"(?:=|[ \t]+)(?P<v>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"-][^\s'\"]*)"
)
_TOKEN_TAIL = re.compile(r"[\w/+=-]*")  # a detector may match only a token's first characters
_PLAIN = re.compile(r"[A-Za-z][\w+.-]*://[^@\s]*$|~?\.{0,2}/")  # a URL without credentials, a path
_ASSIGNED = (  # NAME = "quoted" or NAME=BareValue, NAME secret-looking; then any *key = long value
    re.compile(
        rf"(?i)\b(?P<name>[\w.-]*(?:{_WORD})[\w.-]*)['\"]?\]?\s*[:=]\s*"
        r"(?:(?P<q>['\"])(?P<v>[^'\"\n]+)(?P=q)|(?P<b>[A-Za-z0-9+/_-]{8,}={0,2})(?![\w(.\[]))"
    ),
    re.compile(
        r"(?i)\b(?P<name>[\w.-]*key)['\"]?\]?\s*[:=]\s*['\"]?(?P<b>[A-Za-z0-9+/_-]{16,}={0,2})(?![\w(.\[])"
    ),
)


def secret_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The secret-looking variables of ``environ`` (default: this process's), as sent with an export."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if ENV_NAME.search(k) and len(v.strip()) >= MIN_ENV_VALUE}


def _patterns(detector: BasePlugin) -> list[tuple[re.Pattern[str], int | None]]:
    """A detector's regular expressions, each with the group that holds the secret (None: find it)."""
    if isinstance(detector, KeywordDetector):
        return list(QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP.items())
    return [(p, None) for p in getattr(detector, "denylist", ())]


def _secret_span(m: re.Match[str], group: int | None) -> tuple[int, int]:
    """The secret in a match: the named group, else the last long group past its start, else all."""
    if group is not None:
        return m.span(group)
    for g in range(m.re.groups, 0, -1):
        a, b = m.span(g)
        if a > m.start() and b - a >= MIN_ENV_VALUE:
            return a, b
    return m.span()


def _identifier(value: str) -> bool:
    """A bare value that reads as a Python name (``my_var``, ``model``), not as a random secret."""
    return value.isidentifier() and ("_" in value or not any(c.isdigit() for c in value))


def _placeholder(value: str) -> bool:
    """Values detect-secrets' own filters dismiss, plus a bare secret word (``password = "password"``)."""
    return (
        len(value) < 4
        or value == SCRUBBED
        or is_templated_secret(value)
        or is_sequential_string(value)
        or is_potential_uuid(value)
        or re.fullmatch(_WORD, value, re.IGNORECASE) is not None
    )


class Scrubber:
    """Replace secrets by ``<scrubbed>``; ``found`` says where and what kind, never the value.

    ``environ`` holds the environment whose secret-looking values are scrubbed wherever they
    appear: the kernel's, handed over by whoever asks for the export.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        pairs = [(v, k) for k, v in secret_environ(environ).items()]
        self._env = sorted(pairs, key=lambda p: -len(p[0]))
        self._detectors = [cls() for cls in _DETECTORS]
        self.found: list[str] = []

    def _note(self, place: str, what: str) -> str:
        if f"{place}: {what}" not in self.found:
            self.found.append(f"{place}: {what}")
        return SCRUBBED

    def text(self, text: str, place: str) -> str:
        """``text`` with every secret it holds replaced; names and code around them unchanged."""
        for value, name in self._env:
            if value in text:
                text = text.replace(value, self._note(place, f"the value of ${name}"))
        text = _PEM.sub(lambda m: self._note(place, "a private key"), text)
        text = _TOKEN.sub(lambda m: self._note(place, "a token"), text)
        text = self._detected(text, place)
        text = _URL_PASSWORD.sub(lambda m: self._span(m, "v", place, "a password in a URL"), text)
        text = _FLAG.sub(lambda m: self._span(m, "v", place, f"the value of {m['name']}"), text)
        return self._assigned(text, place)

    def _assigned(self, text: str, place: str) -> str:
        for pattern in _ASSIGNED:
            text = pattern.sub(lambda m: self._value(m, place), text)
        return text

    def _detected(self, text: str, place: str) -> str:
        """``text`` with what detect-secrets' patterns match replaced, placeholders kept."""
        spans: list[tuple[int, int, str]] = []
        for detector in self._detectors:
            for pattern, group in _patterns(detector):
                for m in pattern.finditer(text):
                    a, b = _secret_span(m, group)
                    if not _placeholder(m.string[a:b]):
                        spans.append((a, b, detector.secret_type))
        pieces: list[str] = []
        end = len(text)
        for a, b, kind in sorted(spans, reverse=True):  # right to left: earlier offsets stay valid
            if a >= end:
                continue  # inside a span already replaced
            tail = _TOKEN_TAIL.match(text, b)
            b = min(end, tail.end() if tail else b)
            pieces += [text[b:end], self._note(place, f"a {kind}")]
            end = a
        return text[:end] + "".join(reversed(pieces))

    def _span(self, m: re.Match[str], group: str, place: str, what: str) -> str:
        if SCRUBBED in m[group]:
            return m[0]
        (a, b), s = m.span(group), m.start()
        return m[0][: a - s] + self._note(place, what) + m[0][b - s :]

    def _value(self, m: re.Match[str], place: str) -> str:
        group = "v" if m.groupdict().get("v") else "b"
        if _placeholder(m[group]) or _PLAIN.match(m[group]) or (group == "b" and _identifier(m[group])):
            (a, b), s = m.span(group), m.start()  # kept: what it holds may still be assigned a secret
            return m[0][: a - s] + self._assigned(m[group], place) + m[0][b - s :]
        return self._span(m, group, place, f"a secret assigned to {m['name']}")

    def data(self, value: object, place: str) -> Any:  # Any: the JSON it was given, scrubbed
        """Scrub a JSON-like value: leaves under secret-looking keys go whole, strings by :meth:`text`."""
        if isinstance(value, dict):
            return {k: self._item(k, v, f"{place}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v, f"{place}[{i}]") for i, v in enumerate(value)]
        return self.text(value, place) if isinstance(value, str) else value

    def _item(self, key: object, value: object, place: str) -> object:
        leaf = value is not None and not isinstance(value, (bool, dict, list))
        if leaf and isinstance(key, str) and _SECRET_KEY.search(key) and value != SCRUBBED:
            return self._note(place, "a secret-named setting")
        return self.data(value, place)
