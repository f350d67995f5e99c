"""Push an export folder to the Hugging Face Hub: one clear line on any failure, no hang where the cause is known.

The token comes from ``HF_TOKEN`` or the standard login (``hf auth login``) only; it is passed to the
client and never printed or written. Offline mode is checked before anything touches the network, and
a single short whoami request proves the Hub reachable and the token valid before ``upload_folder``,
whose own retries (about 24 s) would otherwise hide an unreachable Hub.
"""

from __future__ import annotations

import os
from pathlib import Path

from qgmem_train.errors import first_line

PROBE_TIMEOUT_S = 10.0
"""Seconds the reachability probe may take (the Hub client itself has no timeout)."""
_TRUE = {"1", "on", "yes", "true"}


class PushError(Exception):
    """The push did not happen; the message says why in one line."""


def hub_offline() -> bool:
    """Whether Hugging Face offline mode is on (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    from huggingface_hub import is_offline_mode

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    return env in _TRUE or is_offline_mode()


def _one_line(exc: BaseException, token: str | None) -> str:
    text = first_line(exc)
    return text.replace(token, "***") if token else text


def push_folder(folder: str | os.PathLike, repo_id: str, *, private: bool = False, revision: str | None = None) -> str:
    """Create (or reuse) model repo ``repo_id`` and upload ``folder`` in one commit; return the commit URL."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    folder = Path(folder)
    if hub_offline():
        raise PushError(f"offline mode is on (HF_HUB_OFFLINE): not pushed to {repo_id}; the export is complete at {folder}")
    token = get_token()
    if not token:
        raise PushError(f"no Hugging Face token: set HF_TOKEN or run `hf auth login`, then push {folder} to {repo_id}")
    api = HfApi(token=token)
    step = "reach the Hub"
    try:
        response = get_session().get(f"{api.endpoint}/api/whoami-v2", headers=build_hf_headers(token=token), timeout=PROBE_TIMEOUT_S)
        hf_raise_for_status(response)
        step = "create the repository"
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        if revision:
            step = f"create branch {revision}"
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        step = "upload"
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision, commit_message=f"Upload QGMem export {folder.name}")
    except Exception as exc:  # network, auth, permissions, missing branch: each ends as one line for the user
        raise PushError(f"push to {repo_id} failed to {step} at {api.endpoint}: {type(exc).__name__}: {_one_line(exc, token)}") from None
    return commit.commit_url
