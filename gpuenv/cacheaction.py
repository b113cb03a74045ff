"""The action of the build caches' modules (gpuenv_env_cache, gpuenv_cudnn_cache) on the controller.

A host that restores an entry needs the entry's tar from the controller. ansible.builtin.copy would
bring it, but it stats the destination first (one module run), and on the host it reads the whole
copy once more for its sha1 before moving it into place: seconds of a host's CPU for a 2.5 GB
environment, work the unpack does again when it hashes the same bytes with sha256 against the
cache's record. So with ``copy_from`` (a file on the controller) the unpack's task transfers the file
itself, straight to ``src``, and the unpack's own sha256 is the only check: a copy damaged on the way
is refused there like any other.

Straight means as the connection's user. Where the task becomes another user (``become`` from an
unprivileged login), that user owns the destination and the connection's user may not write there,
so the file goes through ansible.builtin.copy's action instead, which stages it and moves it as the
become user. Every other mode, and an unpack without ``copy_from``, is the module alone.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

# Whoever reads the copy on the host is root (or the become user): nobody else needs it meanwhile.
COPY_MODE = "0600"


class CacheUnpackAction(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        copy_from = args.pop("copy_from", None)
        if copy_from is not None and args.get("mode") == "unpack" and not self._task.check_mode:
            failure = self.bring(str(copy_from), str(args.get("src") or ""), task_vars or {})
            if failure:
                result.update(failure)
                return result
        result.update(self._execute_module(module_name=self._task.action, module_args=args, task_vars=task_vars))
        return result

    def bring(self, copy_from: str, dest: str, task_vars: dict[str, Any]) -> dict[str, Any]:
        """Put the controller's copy_from at dest on the host; a failed result, or {} once it is there."""
        if not dest:
            return {"failed": True, "msg": "copy_from needs src, the path on the host the copy is written to"}
        if not os.path.isfile(copy_from):
            return {
                "failed": True,
                "msg": f"the controller's cache has no file {copy_from} (removed since the plan read it?); "
                "run the play again, and the cache is planned afresh",
            }
        if not self.writes_as_connection_user():
            return self.copy_as_become_user(copy_from, dest, task_vars)
        try:
            self._transfer_file(copy_from, dest)
            chmod = self._remote_chmod([dest], COPY_MODE)
        except AnsibleError as err:
            return {"failed": True, "msg": f"copying {copy_from} to {dest} on the host failed: {err}"}
        if chmod.get("rc", 0) != 0:
            return {"failed": True, "msg": f"could not chmod {COPY_MODE} {dest} on the host: {chmod.get('stderr', '')}"}
        return {}

    def writes_as_connection_user(self) -> bool:
        """Whether the module runs as the user the connection writes files as."""
        if not self._connection.become:
            return True
        return bool(self.get_become_option("become_user") == self._get_remote_user())

    def copy_as_become_user(self, copy_from: str, dest: str, task_vars: dict[str, Any]) -> dict[str, Any]:
        """ansible.builtin.copy's action for the file (staged, then moved by the become user)."""
        task = self._task.copy()
        task.args = {"src": copy_from, "dest": dest, "mode": COPY_MODE}
        copy = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.copy",
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        copied: dict[str, Any] = copy.run(task_vars=task_vars)
        if copied.get("failed"):
            return {"failed": True, "msg": f"copying {copy_from} to {dest} on the host failed: {copied.get('msg', '')}"}
        return {}
