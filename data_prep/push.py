"""Push a merged trajectory dataset to the Hugging Face Hub (token from the environment only)."""

from __future__ import annotations

from qgmem_train.errors import ModelUnavailableError


def push_dataset(path: str, repo_id: str) -> None:
    """Upload the DatasetDict folder as a private dataset repo; offline or network failure is one line."""
    import datasets
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        datasets.load_from_disk(path).push_to_hub(repo_id, private=True)
    except OfflineModeIsEnabled:
        raise ModelUnavailableError(f"cannot push to {repo_id}: the Hub is offline (HF_HUB_OFFLINE=1); the dataset is at {path}") from None
    except Exception as exc:  # httpx/requests/hub errors: one line for the user, the data stays on disk
        raise ModelUnavailableError(f"cannot push to {repo_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; the dataset is at {path}") from None
