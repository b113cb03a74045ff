"""The stack file: reading it, its schema, and merging a named profile under the declared keys.

Everything here is about shape, not compatibility: a stack that gets through :func:`parse_stack`
is well formed, and :mod:`gpuenv.rules` then judges whether it can work.
"""

from __future__ import annotations

import difflib
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuenv.compat import CompatData

TOP_KEY = "gpu_stack"


@dataclass(frozen=True)
class Field:
    name: str
    required: bool
    pattern: str
    example: str
    help: str


# The keys of `gpu_stack`. Roles that need more keys add them here, so that an unknown key is
# always an error rather than a silently ignored typo.
FIELDS: dict[str, Field] = {
    f.name: f
    for f in (
        Field(
            "profile",
            False,
            r"[a-z0-9][a-z0-9.\-]*",
            "torch-2.5-cu124",
            "a named, pre-checked combination (gpuenv profiles lists them); keys beside it override it",
        ),
        Field(
            "gpu",
            False,
            r".+",
            "NVIDIA GeForce RTX 4090",
            'a GPU model as nvidia-smi names it, or a compute capability such as "8.9"; a list for mixed hosts',
        ),
        Field(
            "os",
            False,
            r"[a-z]+[0-9]+",
            "debian12",
            "the hosts' OS (debian12, debian13, ubuntu2204, ubuntu2404, rhel9)",
        ),
        Field(
            "driver",
            True,
            r"[0-9]{3}(\.[0-9]{1,4}){0,2}",
            "550",
            'a driver branch ("550") or an exact version ("550.163.01")',
        ),
        Field(
            "cuda",
            True,
            r"none|[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,4})?",
            "12.4.1",
            "the CUDA toolkit release (X.Y.Z), or none: no system toolkit (torch's wheels bring their own "
            "CUDA runtime and cuDNN)",
        ),
        Field(
            "cudnn",
            True,
            r"none|[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,4}(\.[0-9]{1,4})?",
            "9.1.0.70",
            'a cuDNN release ("8.2.1", which means its build in the data) or build ("9.1.0.70") to install '
            "into the CUDA tree, or none",
        ),
        Field("python", True, r"3\.[0-9]{1,3}", "3.11", "the Python version of the environment"),
        Field("torch", True, r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,4}", "2.5.1", "the PyTorch release"),
        Field(
            "torch_variant",
            False,
            r"cu[0-9]{3}",
            "cu124",
            "the PyTorch CUDA wheel variant; derived from cuda when absent",
        ),
        Field(
            "packages",
            False,
            r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+",
            "numpy==2.3.4",
            "a list of extra Python packages for the environment, each pinned as name==version",
        ),
    )
}


class SpecError(Exception):
    """The stack cannot be read or does not match the schema (check-spec exit 2)."""

    def __init__(self, problems: list[str]) -> None:
        problems = list(dict.fromkeys(problems))  # one line per problem, even for a list of repeats
        if len(problems) > MAX_PROBLEMS:  # 40,000 unknown keys must not print 40,000 lines
            more = len(problems) - MAX_PROBLEMS
            problems = [*problems[:MAX_PROBLEMS], f"... and {more} more problems not shown; fix those above first."]
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Stack:
    """A well-formed stack, profile merged. Values are strings exactly as declared."""

    driver: str
    cuda: str
    cudnn: str
    python: str
    torch: str
    torch_variant: str | None = None
    profile: str | None = None
    gpus: list[str] = field(default_factory=list)
    os: str | None = None
    packages: list[str] = field(default_factory=list)
    from_profile: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "profile": self.profile,
            "gpu": self.gpus,
            "os": self.os,
            "driver": self.driver,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "python": self.python,
            "torch": self.torch,
            "torch_variant": self.torch_variant,
            "packages": self.packages,
        }
        return out


# A stack file is a few hundred bytes and two levels deep; hostile input gets a clear refusal, not
# a traceback, a hang or gigabytes of memory.
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
# The most problems a refusal lists, and the longest value a stack holds (a GPU's name is under 60
# characters): a pasted blob is refused, not echoed whole by every rule that names it.
MAX_PROBLEMS = 25
MAX_VALUE = 200
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")


class _NumberText(str):
    """An integer that YAML 1.1 reads in another base or with separators (0550 is octal 360, 0x226
    is 550, 1_000, 1:30 sexagesimal): kept as its text so that the stack check refuses it."""

    value: int

    def __new__(cls, text: str, value: int) -> _NumberText:
        obj = super().__new__(cls, text)
        obj.value = value
        return obj

    def why(self) -> str:
        text = self.lstrip("+-")
        if text.startswith(("0x", "0X")):
            return "0x makes it hexadecimal"
        if text.startswith(("0b", "0B")):
            return "0b makes it binary"
        if ":" in text:
            return "a colon makes it base 60"
        if "_" in text:
            return "YAML drops the underscores"
        return "a leading 0 makes it octal"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML would keep the last one silently), nesting
    deeper than MAX_DEPTH, and keeps non-decimal integers as _NumberText."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise SpecError(
                    [f"line {line}: nested more than {MAX_DEPTH} levels deep; a stack file is a flat mapping."]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int | _NumberText:
    value: int = loader.construct_yaml_int(node)
    return value if _DECIMAL.fullmatch(str(node.value)) else _NumberText(str(node.value), value)


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[tuple[type, Any], int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, which Ansible accepts too
            continue
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise SpecError(
                [f"line {key_node.start_mark.line + 1}: a key must be a plain word, not {_kind(key)}."]
            ) from None
        marker = (type(key), key)  # 1 and true are different keys, though 1 == True in Python
        if marker in seen:
            raise SpecError(
                [
                    f"line {key_node.start_mark.line + 1}: key {key!r} appears twice "
                    f"(first on line {seen[marker]}); YAML would silently keep only the last one. "
                    "Fix: remove one of them."
                ]
            )
        seen[marker] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_stack_file(path: Path) -> dict[str, Any]:
    """Read a stack file and return its `gpu_stack` mapping, or raise SpecError."""
    return load_stack_document(path)[TOP_KEY]  # type: ignore[no-any-return]


def load_stack_document(path: Path) -> dict[str, Any]:
    """Read a stack file (a group_vars document) whose `gpu_stack` is a mapping, or raise SpecError.
    The variables beside gpu_stack matter too: pytorch_env_backend decides who provides Python."""
    text = _read_small_file(path)
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except SpecError as exc:
        raise SpecError([f"{path}: {p}" for p in exc.problems]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"{path}: not valid YAML: {_short(str(exc), 300)}"]) from None
    except RecursionError:
        raise SpecError([f"{path}: nested too deeply to read; a stack file is a flat mapping."]) from None
    if not isinstance(document, dict) or TOP_KEY not in document:
        raise SpecError(
            [
                f"{path}: no top-level '{TOP_KEY}' key. A stack file is a group_vars file whose "
                f"'{TOP_KEY}:' mapping declares the stack; see docs/stack-file.md."
            ]
        )
    stack = document[TOP_KEY]
    if not isinstance(stack, dict):
        raise SpecError([f"{path}: '{TOP_KEY}' must be a mapping of keys to values, not {_kind(stack)}."])
    return document


def _read_small_file(path: Path) -> str:
    """The text of a regular file of at most MAX_BYTES (a link to a device or a FIFO would hang
    the read, a huge file would fill memory)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise SpecError([f"{path}: not a regular file; give the path of a group_vars file that holds gpu_stack."])
        if info.st_size > MAX_BYTES:
            raise SpecError([f"{path}: {info.st_size} bytes, over the {MAX_BYTES}-byte limit for a stack file."])
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:  # it grew after the stat
            raise SpecError([f"{path}: over the {MAX_BYTES}-byte limit for a stack file."])
        return data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError(
            [f"{path}: no such file. Fix: give the path of a group_vars file that holds gpu_stack."]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"{path}: cannot be read ({_short(str(exc), 200)})."]) from None


def _kind(value: Any) -> str:  # noqa: PLR0911 - one return per YAML type
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _short(text: str, limit: int = 60) -> str:
    """A value as messages quote it: a pasted blob must not flood the report."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _number(value: int) -> str:
    """An integer as messages quote it; one past Python's limit on decimal digits (a 0x followed by
    thousands of hex digits) is described, not printed."""
    try:
        return _short(str(value))
    except ValueError:
        return f"of about {value.bit_length() * 3 // 10} digits"


def _as_text(key: str, value: Any, problems: list[str]) -> str | None:  # noqa: PLR0911 - one return per trap
    """One scalar value as a string, with the classic YAML traps turned into clear errors."""
    spec = FIELDS[key]
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        hint = " (write none as the word none)" if key in ("cudnn", "cuda") and value is None else ""
        problems.append(f'gpu_stack.{key}: expected a string such as "{spec.example}", got {_kind(value)}{hint}.')
        return None
    if isinstance(value, _NumberText):
        problems.append(
            f"gpu_stack.{key}: {_short(str(value))} is read by YAML as the number {_number(value.value)} "
            f'({value.why()}). Fix: quote it, e.g. {key}: "{spec.example}".'
        )
        return None
    if isinstance(value, float):
        # python: 3.10 is the float 3.1 to YAML; cuda: 12.10 would be 12.1.
        problems.append(
            f"gpu_stack.{key}: {value!r} was read as a number, which loses digits "
            f'(3.10 becomes 3.1). Fix: quote it, e.g. {key}: "{spec.example}".'
        )
        return None
    text = str(value).strip()
    if len(text) > MAX_VALUE:
        problems.append(f"gpu_stack.{key}: {_short(text)!r} is longer than any stack value ({MAX_VALUE} characters).")
        return None
    if "{{" in text or "{%" in text:
        problems.append(
            f"gpu_stack.{key}: {_short(text)!r} is a Jinja template; check-spec reads literal values. "
            "Fix: write the value itself, or run the playbook, whose preflight sees rendered values."
        )
        return None
    if not re.fullmatch(spec.pattern, text):
        problems.append(f'gpu_stack.{key}: {_short(text)!r} is not {spec.help} (for example "{spec.example}").')
        return None
    return text


def parse_stack(raw: dict[str, Any], data: CompatData) -> Stack:
    """Validate a `gpu_stack` mapping, merge its profile, and return the Stack (or raise SpecError)."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key = str(raw_key)
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            problems.append(f"gpu_stack.{_short(key)}: unknown key.{hint} Known keys: {', '.join(FIELDS)}.")
            continue
        if key == "packages":
            if not isinstance(value, list):
                problems.append(f'gpu_stack.packages: expected a list such as ["numpy==2.3.4"], got {_kind(value)}.')
                continue
            pins = [_as_text("packages", item, problems) for item in value]
            values[key] = [p for p in pins if p is not None]
            continue
        if key == "gpu" and isinstance(value, list):
            if not value:
                problems.append("gpu_stack.gpu: the list is empty; leave the key out instead.")
            gpus = [_as_text("gpu", item, problems) for item in value]
            values[key] = [g for g in gpus if g is not None]
            continue
        text = _as_text(key, value, problems)
        if text is not None:
            values[key] = [text] if key == "gpu" else text

    from_profile: list[str] = []
    profile_name = values.get("profile")
    if profile_name is not None:
        profile = data.profiles.get(profile_name)
        if profile is None:
            close = difflib.get_close_matches(profile_name, data.profiles, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            problems.append(
                f"gpu_stack.profile: no profile named {_short(profile_name)!r}.{hint} "
                f"Known profiles: {', '.join(sorted(data.profiles))} (gpuenv profiles shows them)."
            )
        else:
            for key, value in profile.stack.items():
                if key not in values:
                    values[key] = value
                    from_profile.append(key)
            # A profile's wheel variant belongs to its torch release: with torch overridden, derive
            # the variant again (from cuda) rather than keep one the new release may not have.
            if "torch_variant" in from_profile and "torch" not in from_profile:
                del values["torch_variant"]
                from_profile.remove("torch_variant")

    if "os" in values and values["os"] not in data.os:
        problems.append(f"gpu_stack.os: {_short(values['os'])!r} is not one of {', '.join(data.os)}.")
    declared = {str(k) for k in raw}
    missing = [k for k, f in FIELDS.items() if f.required and k not in values and k not in declared]
    if missing:
        problems.append(
            f"gpu_stack: missing {', '.join(missing)}. Fix: declare them, or name a profile that "
            "provides them (gpuenv profiles lists the profiles)."
        )
    if problems:
        raise SpecError(problems)
    return Stack(
        driver=values["driver"],
        cuda=values["cuda"],
        cudnn=values["cudnn"],
        python=values["python"],
        torch=values["torch"],
        torch_variant=values.get("torch_variant"),
        profile=profile_name,
        gpus=values.get("gpu", []),
        os=values.get("os"),
        packages=values.get("packages", []),
        from_profile=from_profile,
    )
