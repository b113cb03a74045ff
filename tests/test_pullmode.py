"""Pull mode's inputs: what may reach the root systemd unit, and how it
is quoted. The role runs in check mode on the controller, so the unit it would write is read from
its diff and split the way systemd splits an ExecStart line."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuenv import pullmode
from tests.conftest import REPO, run_tool

SIGNER = "site@gpuenv.invalid ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0W9Yd8n0w4xK1r8pVh9uYpI5xk1q0h2l6m3n4o5p6q"
GOOD: dict[str, Any] = {
    "url": "https://git.example.com/gpu-site.git",
    "allow_insecure_url": False,
    "branch": "main",
    "inventory": "inventory/site",
    "playbook": "playbooks/site.yml",
    "venv": "/opt/gpuenv/pull/venv",
    "checkout": "/var/lib/gpuenv/pull/checkout",
    "log": "/var/log/gpuenv-pull.log",
    "config_dir": "/etc/gpuenv/pull",
    "interval": "30min",
    "randomized_delay": "10min",
    "verify_commit": True,
    "allowed_signers": [SIGNER],
}


def _problems(**changes: Any) -> list[str]:
    return pullmode.problems({**GOOD, **changes})


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example.com/gpu-site.git",
        "ssh://git@git.example.com:2222/ops/gpu-site.git",
        "git@git.example.com:ops/gpu-site.git",
        "/srv/gpuenv-site.git",
        "file:///srv/gpuenv-site.git",
    ],
)
def test_secure_repository_urls_pass(url: str) -> None:
    assert _problems(url=url) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://git.example.com/x.git\nExecStartPre=/bin/sh -c id", "a newline"),
        ("https://git.example.com/x.git --upload-pack=touch", "a space"),
        ("https://git.example.com/x.git\n", "a newline"),
        ("--upload-pack=touch /tmp/pwned", "a space"),
        ("-uhttps://x", "starts with '-'"),
        ("ext::sh", "remote helper"),
        ("http://git.example.com/x.git", "plain http://"),
        ("git://git.example.com/x.git", "plain git://"),
        ("ftp://git.example.com/x.git", "is not https://"),
        ("", "is empty"),
    ],
)
def test_unsafe_repository_urls_are_refused_with_the_reason(url: str, says: str) -> None:
    found = _problems(url=url)
    assert len(found) == 1
    assert says in found[0]


def test_plain_http_only_where_explicitly_allowed() -> None:
    assert _problems(url="http://git.lan/x.git", allow_insecure_url=True) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("branch", "main\nExecStartPre=/bin/true"),
        ("branch", "main\n"),
        ("interval", "30min\n"),
        ("branch", "--orphan"),
        ("branch", "a..b"),
        ("branch", "main other"),
        ("inventory", "../../etc"),
        ("inventory", "/etc/ansible/hosts"),
        ("playbook", "playbooks/site.yml --extra-vars x=1"),
        ("venv", "relative/venv"),
        ("checkout", "/var/lib/../tmp/x"),
        ("log", "/var/log/x.log\nUser=nobody"),
        # Written into the pulls' gitconfig: a newline would add a [core] section of its own.
        ("config_dir", "/etc/gpuenv/pull\n[core]\n\tsshCommand = touch /tmp/pwned"),
        ("interval", "30min\nExecStartPre=/bin/true"),
        ("randomized_delay", "soon"),
    ],
)
def test_every_value_that_reaches_a_unit_is_checked(key: str, value: str) -> None:
    found = _problems(**{key: value})
    assert len(found) == 1
    assert found[0].startswith(f"pull_mode_{key} ")


def test_verify_commit_needs_signers_and_checks_their_form() -> None:
    assert "pull_mode_allowed_signers is empty" in _problems(allowed_signers=[])[0]
    assert "is not one line of" in _problems(allowed_signers=["site@x ssh-ed25519 AAAA\nssh-rsa BBBB"])[0]
    assert _problems(verify_commit=False, allowed_signers=[]) == []
    assert _problems(allowed_signers=[f'ops@example.com namespaces="git" {SIGNER.split(" ", 1)[1]}']) == []


def test_systemd_quote_escapes_what_systemd_would_expand() -> None:
    assert pullmode.systemd_quote('a "b" \\ 100% $HOME') == '"a \\"b\\" \\\\ 100%% $$HOME"'
    with pytest.raises(ValueError, match="control character"):
        pullmode.systemd_quote("main\nExecStartPre=/bin/true")


def _systemd_split(line: str) -> list[str]:
    """An Exec line's arguments as systemd reads them: shell-like double quotes with backslash
    escapes, then %% and $$ as a literal % and $."""
    return [arg.replace("%%", "%").replace("$$", "$") for arg in shlex.split(line)]


def _check_run(tmp_path: Path, venv_env: dict[str, str], **role_vars: Any) -> dict[str, Any]:
    """The role in check mode on the controller: {"failed": msg} or {"service": the unit's text}."""
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "pull_mode_allowed_signers": [SIGNER],
        **role_vars,
    }
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"controller": host}}}))
    env = {**venv_env, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.oneline", "ANSIBLE_NOCOLOR": "1"}
    playbook = REPO / "tests/ansible/pull_mode_check.yml"
    run = run_tool("ansible-playbook", "--check", "-i", str(inventory), str(playbook), env=env, timeout=300)
    for line in run.stdout.splitlines():
        match = re.match(r"^controller \| (SUCCESS|FAILED!) => (\{.*\})$", line)
        if not match:
            continue
        result = json.loads(match.group(2))
        if match.group(1) == "FAILED!":
            return {"failed": str(result.get("msg")), "stdout": run.stdout}
        if isinstance(result.get("msg"), dict) and "service" in result["msg"]:
            return {"service": result["msg"]["service"], "stdout": run.stdout}
    raise AssertionError(run.stdout + run.stderr)


@pytest.mark.ansible
def test_the_unit_passes_each_value_as_one_argument(tmp_path: Path, venv_env: dict[str, str]) -> None:
    # Valid values with characters systemd treats specially: % (specifiers) and ; & ' in a URL.
    url = "https://git.example.com/ops/gpu%20site.git?ref=a;b&c='d'"
    out = _check_run(tmp_path, venv_env, pull_mode_repo_url=url, pull_mode_branch="release/2026.12")
    assert "service" in out, out.get("failed")
    text = out["service"]
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    args = _systemd_split(exec_line.removeprefix("ExecStart="))
    assert args[:5] == ["/opt/gpuenv/pull/venv/bin/ansible-pull", "--url", url, "--checkout", "release/2026.12"]
    assert "--verify-commit" in args
    assert args[-1] == "playbooks/site.yml"
    assert 'Environment="GIT_CONFIG_GLOBAL=/etc/gpuenv/pull/gitconfig"' in text
    # The venv has ansible-core only: the plugins import the gpuenv package from the checkout.
    checkout = args[args.index("--directory") + 1]
    assert f'Environment="PYTHONPATH={checkout}"' in text
    assert re.search(r'^ExecStartPost="/opt/gpuenv/pull/reboot-if-needed"$', text, re.M)


@pytest.mark.ansible
def test_the_role_refuses_unsafe_settings_before_anything_changes(tmp_path: Path, venv_env: dict[str, str]) -> None:
    out = _check_run(
        tmp_path,
        venv_env,
        pull_mode_repo_url="http://git.example.com/site.git",
        pull_mode_branch="main\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'",
        pull_mode_allowed_signers=[],
    )
    msg = out.get("failed", "")
    assert "nothing was changed on controller" in msg, out
    assert "is plain http://" in msg
    assert "pull_mode_branch" in msg
    assert "pull_mode_allowed_signers is empty" in msg
    # The refusal is the role's first task after its argument spec: nothing ran after it.
    lines = [line for line in out["stdout"].splitlines() if line.startswith("controller | ")]
    assert [line.split(" => ")[0] for line in lines] == ["controller | SUCCESS"] * 2 + ["controller | FAILED!"]


def test_the_pull_mode_lock_pins_the_controllers_versions_with_hashes() -> None:
    """requirements/pull-mode.lock (scripts/lock) holds ansible-core and what it needs at the
    controller's pins, each with sha256 hashes, so that pip --require-hashes installs it on a host."""
    controller = dict(
        line.split("==", 1)
        for line in (REPO / "requirements/controller.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    lock = (REPO / "requirements/pull-mode.lock").read_text()
    entries = re.findall(r"^([A-Za-z0-9._-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\\n|\n))+)", lock, re.M)
    assert {name.lower() for name, _, _ in entries} >= {"ansible-core", "jinja2", "pyyaml", "cryptography"}
    for name, version, hashes in entries:
        assert controller[name] == version, name
        assert hashes.count("--hash=sha256:") >= 1, name


def test_false_given_as_a_string_is_false() -> None:
    # -e pull_mode_allow_insecure_url=false passes the string "false", which bool() calls true.
    assert "is plain http://" in _problems(url="http://git.lan/x.git", allow_insecure_url="false")[0]
    assert _problems(url="http://git.lan/x.git", allow_insecure_url="yes") == []
    assert "pull_mode_allowed_signers is empty" in _problems(verify_commit="True", allowed_signers=[])[0]
    assert _problems(verify_commit="false", allowed_signers=[]) == []


def test_a_missing_branch_is_not_the_branch_none() -> None:
    assert _problems(branch=None)[0].startswith("pull_mode_branch '' is not a branch")
