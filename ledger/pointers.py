"""JSON Pointers (RFC 6901): how configuration and handlers name one value inside an event payload.

A handler's ``fingerprint=["/data/object/amount", …]`` and a source's ``tenant_from = "/account"`` are
pointers. They are parsed once, where they are declared, so a typo stops registration or start-up
instead of every delivery; resolving one never raises anything but ``PointerMissing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_POINTER_LENGTH = 512


class PointerMissing(LookupError):
    """The payload has no value where the pointer points."""


@dataclass(frozen=True, slots=True)
class JsonPointer:
    """A parsed JSON Pointer; ``text`` is how it was written, ``tokens`` the unescaped reference tokens."""

    text: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: object) -> JsonPointer:
        """Parse ``text``; raises ``ValueError`` saying what is wrong with it."""
        if not isinstance(text, str):
            raise ValueError(f"a JSON Pointer must be a string, got {type(text).__name__} {text!r}")
        if len(text) > MAX_POINTER_LENGTH:
            raise ValueError(f"JSON Pointer longer than {MAX_POINTER_LENGTH} characters")
        if text == "":
            return cls(text, ())
        if not text.startswith("/"):
            raise ValueError(f"JSON Pointer {text!r} must start with '/' (e.g. '/data/object/amount')")
        tokens = []
        for raw in text[1:].split("/"):
            # ~0 is "~" and ~1 is "/"; any other "~" is malformed (RFC 6901, section 3).
            if "~" in raw.replace("~0", "").replace("~1", ""):
                raise ValueError(f"JSON Pointer {text!r}: '~' must be followed by 0 or 1")
            tokens.append(raw.replace("~1", "/").replace("~0", "~"))
        return cls(text, tuple(tokens))

    def resolve(self, document: Any) -> Any:
        """The value this pointer names in ``document``; raises ``PointerMissing`` if there is none."""
        value = document
        for token in self.tokens:
            if isinstance(value, dict):
                if token not in value:
                    raise PointerMissing(self.text)
                value = value[token]
            elif isinstance(value, list):
                # Array indexes are decimal without leading zeros; "-" (past the end) never resolves.
                if (
                    not (token.isascii() and token.isdigit())
                    or (token != "0" and token.startswith("0"))
                    or int(token) >= len(value)
                ):
                    raise PointerMissing(self.text)
                value = value[int(token)]
            else:
                raise PointerMissing(self.text)
        return value

    def __str__(self) -> str:
        return self.text
