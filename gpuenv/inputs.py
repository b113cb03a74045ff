"""The forms of inventory values that end up in files a shell sources or a parser reads.

An inventory value written into /etc/profile.d (sourced by every login shell, root's too), an apt
deb822 source, DKMS's framework.conf (sourced by bash) or authorized_keys must not carry a newline,
a quote or a shell expansion: those would add a directive, a command or another key. Each role
checks its values here before it changes anything (filter gpuenv_input_problems), and pull mode's
checks use the same forms. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Each form: the pattern a whole value must match (fullmatch: "$" alone would let a trailing
# newline through), and what the form is, for the refusal.
FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    # Directory services allow upper case and dots; nothing a shell or a parser would read.
    "account": (
        re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}"),
        "a plain account or group name (letters, digits, _ . -)",
    ),
    "name": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"), "a plain name (letters, digits, . _ -)"),
    "abs_path": (
        re.compile(r"/(?!(?:.*/)?\.\.(?:/|$))[A-Za-z0-9._/+-]*"),
        "an absolute path of letters, digits and . _ / + - (no '..')",
    ),
    "rel_path": (
        re.compile(r"(?![-/])(?!(?:.*/)?\.\.(?:/|$))[A-Za-z0-9._/+-]+"),
        "a relative path of letters, digits and . _ / + - (no '..')",
    ),
    "url": (
        re.compile(r"(https?|file)://[A-Za-z0-9._~:/?#@!&'()*+,;=%\[\]{}-]+"),
        "an http(s):// or file:// URL without spaces, quotes or newlines",
    ),
    # ssh-keygen(1) AUTHORIZED_KEYS: optional options, a key type, its base64, an optional comment.
    "ssh_key": (
        re.compile(
            r"(?:[a-z-]+(?:=\"[^\"\n\r]*\")?(?:,[a-z-]+(?:=\"[^\"\n\r]*\")?)* )?"
            r"(?:ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com|"
            r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}(?: [^\n\r]*)?"
        ),
        "one public key line: [options] key-type base64-key [comment]",
    ),
}


def show(value: object) -> str:
    """A value as refusals quote it: repr, cut to 80 characters."""
    text = str(value)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def problem(name: str, value: Any, form: str) -> str | None:
    """Why `value` (the variable `name`) does not have `form`, or None. A list checks each item."""
    pattern, what = FORMS[form]
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, str) or not pattern.fullmatch(item):
            return f"{name} {show(item)} is not {what}"
    return None


def problems(values: Mapping[str, Any]) -> list[str]:
    """{variable: [value, form]} -> one sentence per value that does not have its form."""
    out = []
    for name, (value, form) in values.items():
        found = problem(str(name), value, str(form))
        if found:
            out.append(found)
    return out
