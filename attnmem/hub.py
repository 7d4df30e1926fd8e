"""Fetch a model's config.json from the Hugging Face Hub, for the pages and the command line.

Uses huggingface_hub (hf_hub_download), so it honours what that library honours: HF_TOKEN (or
the token saved by `hf auth login`) for gated repos, the local cache (HF_HOME / HF_HUB_CACHE),
and offline mode (HF_HUB_OFFLINE=1: cache only). HF_ENDPOINT, HF_HUB_OFFLINE and the cache folder
(HF_HUB_CACHE, HF_HOME) are read here on every call, not once at import, so a test or a
long-running app that changes them is obeyed.

The file is size-checked from its metadata before it is downloaded (a config.json is a few
kB; a repo could name a huge file config.json) and parsed with the app's bounded JSON loader
(attnmem.calc.config_json.load_config_json: size, depth, NaN and duplicate keys refused), then by
calc's ModelConfig.from_hf_config, which refuses unknown architectures. Every failure is a
HubError (a ValueError) whose message says what went wrong and what to do.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from attnmem.calc.config_json import MAX_CONFIG_BYTES, load_config_json
from attnmem.calc.models import ModelConfig

#: owner/name as the Hub spells repository ids (huggingface_hub validate_repo_id rules).
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: The whole rule, for fullmatch (validate_repo_id in huggingface_hub/utils/_validators.py): each
#: part 1-96 characters, starting with a letter or digit and ending with a letter, digit or '_'
#: (its word boundaries), no '--' or '..' anywhere, not ending in '.git'. The pages' URL
#: parameter uses the same text (attnmem.pages.ui.url_state.TextParam).
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
REPO_ID_RULE = rf"(?!.*(?:--|\.\.))(?!.*\.git$){_PART}/{_PART}"
MAX_REPO_ID_LEN = 96 + 1 + 96
DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 10.0


class HubError(ValueError):
    """A config.json could not be fetched or used; the message is for the user."""


def check_repo_id(repo_id: object) -> str:
    """repo_id if it looks like a Hub id (owner/name); HubError naming it otherwise."""
    if not isinstance(repo_id, str) or re.fullmatch(REPO_ID_RULE, repo_id) is None:
        shown = repo_id if isinstance(repo_id, str) else type(repo_id).__name__
        raise HubError(
            f"{str(shown)[:120]!r} is not a Hugging Face model id: give owner/name, e.g. "
            "deepseek-ai/DeepSeek-V3 (letters, digits, '.', '_' and '-')")
    return repo_id


def looks_like_repo_id(text: str) -> bool:
    """True for owner/name strings (used to tell Hub ids from file paths and preset names)."""
    return isinstance(text, str) and bool(REPO_ID.match(text)) and not Path(text).exists()


def cache_key() -> tuple[str, bool, str, str]:
    """What a fetch's answer depends on besides the id: endpoint, offline flag, which token (a
    short fingerprint, never the token) and the cache folder. For callers that cache answers
    (the pages)."""
    token = os.environ.get("HF_TOKEN") or ""
    if not token:
        try:
            from huggingface_hub import get_token
            token = get_token() or ""
        except Exception:  # noqa: BLE001 - no saved token is the same as none
            token = ""
    fingerprint = hashlib.sha256(token.encode()).hexdigest()[:12] if token else ""
    return _endpoint(), _offline(), fingerprint, _cache_dir() or ""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> str | None:
    """HF_HUB_CACHE, else HF_HOME/hub, read now (huggingface_hub reads them once, at import);
    None: the library's own default (~/.cache/huggingface/hub, XDG_CACHE_HOME honoured)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def fetch_config_dict(repo_id: str, revision: str = "main",
                      max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The parsed config.json of repo_id at revision (a dict), or HubError saying why not."""
    check_repo_id(repo_id)
    if not isinstance(revision, str) or not re.fullmatch(r"[A-Za-z0-9._/-]{1,100}", revision):
        raise HubError(f"revision {str(revision)[:60]!r} is not a branch, tag or commit name")
    try:
        import huggingface_hub as hf
        from huggingface_hub import errors as hf_errors
    except ImportError:  # pragma: no cover - requirements.txt installs it
        raise HubError("huggingface_hub is not installed: pip install huggingface_hub") from None
    offline, endpoint = _offline(), _endpoint()
    where = f"{endpoint}/{repo_id}"
    try:
        if not offline:
            url = hf.hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint)
            meta = hf.get_hf_file_metadata(url, timeout=TIMEOUT_S, endpoint=endpoint)
            if meta.size is not None and meta.size > max_bytes:
                raise HubError(
                    f"{repo_id}: config.json is {meta.size:,} bytes; the limit is "
                    f"{max_bytes:,} (a real config.json is a few kB)")
        path = hf.hf_hub_download(repo_id, "config.json", revision=revision,
                                  endpoint=endpoint, local_files_only=offline,
                                  cache_dir=_cache_dir(),
                                  etag_timeout=TIMEOUT_S)
    except HubError:
        raise
    except hf_errors.HFValidationError:  # check_repo_id is stricter; a guard, never a traceback
        raise HubError(f"{repo_id!r} is not a Hugging Face model id huggingface_hub accepts") \
            from None
    except hf_errors.GatedRepoError:
        raise HubError(
            f"{repo_id} is gated: accept its licence on {where} and set HF_TOKEN (or run "
            "`hf auth login`) with an account that has access") from None
    except hf_errors.RepositoryNotFoundError:
        raise HubError(
            f"{repo_id} was not found on {endpoint} (or it is private and no token with access "
            "is set: HF_TOKEN)") from None
    except hf_errors.RevisionNotFoundError:
        raise HubError(f"{repo_id} has no revision {revision!r}") from None
    except hf_errors.EntryNotFoundError:
        if offline:
            raise HubError(
                f"{repo_id}: config.json is not in the local cache and HF_HUB_OFFLINE is set: "
                "fetch it once online, or unset HF_HUB_OFFLINE") from None
        raise HubError(
            f"{repo_id} has no config.json: it is not a transformers language model "
            "repository (GGUF-only and dataset repos have none)") from None
    except (hf_errors.OfflineModeIsEnabled, hf_errors.LocalEntryNotFoundError):
        raise HubError(
            f"cannot reach {endpoint} for {repo_id} and config.json is not in the local "
            "cache: check the network (or HF_ENDPOINT), or fetch it once online") from None
    except hf_errors.HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        raise HubError(f"{where}: the Hub answered HTTP {status or '?'}; try again later") \
            from None
    except OSError as err:  # connection refused, DNS, timeouts (httpx errors are OSErrors?)
        raise HubError(f"cannot reach {endpoint} for {repo_id}: {type(err).__name__}") from None
    except Exception as err:  # noqa: BLE001 - httpx transport errors are not OSErrors
        if type(err).__module__.startswith(("httpx", "httpcore", "requests", "urllib3")):
            raise HubError(
                f"cannot reach {endpoint} for {repo_id} ({type(err).__name__}): check the "
                "network or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the cache") from None
        raise
    size = Path(path).stat().st_size
    if size > max_bytes:
        raise HubError(f"{repo_id}: config.json is {size:,} bytes; the limit is {max_bytes:,}")
    try:
        with open(path, "rb") as f:
            return load_config_json(f, max_bytes=max_bytes)
    except (ValueError, UnicodeDecodeError) as err:
        raise HubError(f"{repo_id}: config.json is not usable JSON: {err}") from None


def fetch_model(repo_id: str, revision: str = "main") -> ModelConfig:
    """ModelConfig of a Hub model (config.json fetched as fetch_config_dict does). A config that
    is not a decoder language model calc knows is refused with calc's message."""
    d = fetch_config_dict(repo_id, revision)
    try:
        return ModelConfig.from_hf_config(d, name=repo_id)
    except ValueError as err:
        raise HubError(f"{repo_id}: not a language-model config calc can size: {err}") from None
