"""A cuDNN version, parsed once: what the stack, NVIDIA's manifests, the packages and cudnn_version.h
write. The controller's code (through gpuenv.versions) and gpuenv's modules on the hosts (as
ansible.module_utils.gpuenv_cudnn_version) read its parts from here instead of splitting strings.
Standard library only, Python 3.8's syntax (the oldest Python ansible-core runs modules with)."""

from __future__ import annotations


class CudnnVersion:
    """A cuDNN build ("9.1.0.70"), release ("9.1.0", what cudnn_version.h says) or major ("9")."""

    __slots__ = ("parts",)

    def __init__(self, text: object) -> None:
        parts = str(text).strip().split(".")
        if not 1 <= len(parts) <= 4 or not all(p.isdigit() and p.isascii() for p in parts):
            raise ValueError(f"not a cuDNN version (major, release or build, such as 9.1.0.70): {text!r}")
        self.parts = tuple(int(p) for p in parts)

    @property
    def major(self) -> str:
        """ "9" of 9.1.0.70: what names cuDNN's libraries (libcudnn.so.9) and NVIDIA's packages."""
        return str(self.parts[0])

    @property
    def release(self) -> str:
        """The "9.1.0" of 9.1.0.70: what cudnn_version.h says and what names NVIDIA's manifests."""
        return ".".join(str(p) for p in self.parts[:3])

    def __str__(self) -> str:
        return ".".join(str(p) for p in self.parts)

    def __repr__(self) -> str:
        return f"CudnnVersion({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CudnnVersion) and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.parts)
