"""Pull mode's inputs, checked before they reach a systemd unit that runs as root.

Every value the pull_mode role writes into gpuenv-pull.service or its timer comes from the
inventory. A newline there adds a directive (ExecStartPre=...), a space adds an argument to
ansible-pull, a leading dash makes a URL or branch an option of git, `%` and `$` are systemd
specifiers and variables, and git's `ext::` transport runs a command. So: each value is checked
against the form it must have, and what goes into ExecStart is quoted as systemd.service(5) says.
"""

from __future__ import annotations

import re

from gpuenv.inputs import FORMS
from gpuenv.inputs import show as _show

# Transports git runs over the network with integrity of their own (TLS, SSH), and local paths.
_SECURE = re.compile(r"^(https://|ssh://|file:///|/)")
_INSECURE = re.compile(r"^(http|git)://")
# scp-like syntax: [user@]host:path (git treats it as ssh).
_SCP = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:(?!//)[^:]")
_URL_CHARS = re.compile(r"^[A-Za-z0-9._~:/?#@!&'()*+,;=%\[\]-]+$")
# git check-ref-format's rules that matter here, and no option-like names.
_REF = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9._/+-]+(?<![./])$")
_REL_PATH = FORMS["rel_path"][0]
_ABS_PATH = FORMS["abs_path"][0]
# Checked with fullmatch: "$" alone would let a trailing newline through.
# systemd.time(7) spans: "30min", "1h 30min", "90".
_SPAN = re.compile(r"^[0-9]+ ?[a-z]*( [0-9]+ ?[a-z]*)*$")
# One allowed_signers line: principals, optional options, a key type and its base64 (ssh-keygen(1)).
_SIGNER = re.compile(
    r"^[A-Za-z0-9.@_*,+-]+ (?:[a-z-]+(?:=\"[^\"\n]*\")?(?:,[a-z-]+(?:=\"[^\"\n]*\")?)* )?"
    r"(?:ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}(?: [^\n]*)?$"
)


def url_problem(url: str, allow_insecure: bool) -> str | None:
    """Why the repository URL cannot go into the unit, or None. The first rule that matches wins."""
    shown = _show(url)
    insecure = _INSECURE.match(url) is not None
    rules: list[tuple[bool, str]] = [
        (not url, "pull_mode_repo_url is empty: name the site's git repository (https://, ssh://, host:path, a path)"),
        (
            not _URL_CHARS.fullmatch(url),
            f"pull_mode_repo_url {shown} holds a space, a quote, a newline or another character no repository URL "
            "has; it would go into a systemd unit that runs as root",
        ),
        (url.startswith("-"), f"pull_mode_repo_url {shown} starts with '-', which git would read as an option"),
        (
            "::" in url.split("/", 1)[0],
            f"pull_mode_repo_url {shown} names a git remote helper ('<transport>::'), which can run commands",
        ),
        (
            insecure and not allow_insecure,
            f"pull_mode_repo_url {shown} is plain {url.split(':', 1)[0]}://: anyone on the path can change what "
            "every host runs as root. Use https:// or ssh://, or set pull_mode_allow_insecure_url: true where the "
            "network is trusted and commits are verified (pull_mode_verify_commit)",
        ),
        (
            not (insecure or _SECURE.match(url) or _SCP.match(url)),
            f"pull_mode_repo_url {shown} is not https://, ssh://, host:path, file:/// or an absolute path",
        ),
    ]
    return next((message for broken, message in rules if broken), None)


def flag(value: object) -> bool:
    """A setting's truth as Ansible reads it: `-e pull_mode_allow_insecure_url=false` passes the
    string "false", which bool() would call true."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y", "t")
    return bool(value)


def _text(value: object) -> str:
    return "" if value is None else str(value)


def problems(settings: dict[str, object]) -> list[str]:
    """Every problem with pull mode's settings, one sentence each (empty: all fit their form)."""
    out = []
    problem = url_problem(_text(settings.get("url")), flag(settings.get("allow_insecure_url", False)))
    if problem:
        out.append(problem)
    # (settings keys, the form each must have, what the form is)
    forms = [
        (("branch",), _REF, "is not a branch or tag name (letters, digits, . _ / + -)"),
        (("inventory", "playbook"), _REL_PATH, "must be a relative path inside the repository, without '..'"),
        (("venv", "checkout", "log", "config_dir"), _ABS_PATH, "must be an absolute path (letters, digits, . _ / + -)"),
        (("interval", "randomized_delay"), _SPAN, "is not a systemd time span such as 30min or 1h 30min"),
    ]
    for keys, form, what in forms:
        for key in keys:
            value = _text(settings.get(key))
            if not form.fullmatch(value):
                out.append(f"pull_mode_{key} {_show(value)} {what}")
    signers = settings.get("allowed_signers", [])
    if flag(settings.get("verify_commit", True)):
        if not isinstance(signers, list) or not signers:
            out.append(
                "pull_mode_verify_commit is on but pull_mode_allowed_signers is empty: list the SSH public keys "
                "allowed to sign the site's commits, as 'principal ssh-ed25519 AAAA...' lines (ssh-keygen(1), "
                "ALLOWED SIGNERS), or set pull_mode_verify_commit: false to run unverified commits as root"
            )
        else:
            for line in signers:
                if not isinstance(line, str) or not _SIGNER.fullmatch(line):
                    out.append(
                        f"pull_mode_allowed_signers entry {_show(str(line))} is not one line of "
                        "'principal [options] key-type base64-key'"
                    )
    return out


def systemd_quote(value: str) -> str:
    """One argument of an Exec*= line: double-quoted, with `\\`, `"`, `%` and `$` escaped
    (systemd.service(5), "Command lines"). Control characters cannot be quoted and are refused."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{_show(value)} holds a control character (a newline?); it cannot go into a systemd unit")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'
