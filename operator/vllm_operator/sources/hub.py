"""Model facts from a Hugging Face Hub endpoint, through the maintained client, huggingface_hub.

One job: for a model id and revision, ask the Hub (https://huggingface.co, or the mirror the operator is configured
with) for the model's config.json and its safetensors metadata (the exact parameter count per dtype, from the API:
no weight file is downloaded), as :class:`HubFacts`, or fail with a category (:class:`HubError`) that holds nothing
the server sent; and where to look (:func:`endpoint_setting`) with which token (:func:`read_token_file`).

huggingface_hub builds the requests (endpoint, revision, the token's header, its error classes: gated, not found,
no such revision); every request it makes goes through one httpx2 client (hubclient.py, installed with
``set_client_factory`` at the first lookup), which bounds what huggingface_hub does not:

- one deadline for the whole lookup: every connect, TLS handshake, send and socket read waits at most what is left
  of it (a network backend of our own under httpcore2), so a server that trickles a byte a second cannot hold a
  reconcile past it;
- a byte cap per answer (Content-Length checked first, then counted as it streams);
- only the lookup's own endpoint (scheme, host and port): a redirect to another host is refused (the Hub's CDN for
  LFS files included: config.json and the API answer need none), a relative one on the same host (a renamed repo)
  is followed. The token goes only to the endpoint.

No retries inside one lookup: the caller's cache (model_facts.ConfigCache) keeps the last good facts and tries again
after a minute, which bounds the Hub's load from many servers better than a retry per reconcile would.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from . import fetch as net

log = logging.getLogger(__name__)

#: Where model facts come from when nothing else is configured.
DEFAULT_ENDPOINT = "https://huggingface.co"
#: Values of HF_HUB_OFFLINE that mean offline, as huggingface_hub reads them.
_TRUE = ("1", "on", "yes", "true")
#: Seconds one lookup (the API answer and config.json together) may take.
DEFAULT_SECONDS = 10.0
#: The largest answer read. The model API's answer with expand=safetensors,sha is under 1 KB; config.json is under
#: 100 KB (model_facts.MAX_CONFIG_BYTES is the same bound).
MAX_ANSWER_BYTES = 2**20
#: What a gated model without a token that opens it is told (a fix, not the Hub's words).
GATED = ("the model is gated on the Hub and the operator has no token that opens it: give the operator one "
         "(chart value operator.hfTokenSecret, flag --hf-token-file), or set spec.model.configURL or "
         "spec.model.architecture")


#: Bytes per element of each safetensors dtype (the format's own list).
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}


class HubError(ValueError):
    """A failed lookup, as a category safe to show anywhere."""

    def __init__(self, category: str, *, gated: bool = False):
        super().__init__(category)
        self.gated = gated


@dataclass(frozen=True)
class HubFacts:
    """What the Hub says of one model revision."""

    config: dict[str, Any]
    #: The commit the revision resolved to (config.json was read at it), when the Hub said.
    sha: Optional[str] = None
    #: safetensors dtype (BF16, F8_E4M3, U8, ...) -> how many stored elements, from the Hub's metadata.
    parameters: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> Optional[int]:
        return sum(self.parameters.values()) if self.parameters else None

    @property
    def stored_bytes(self) -> Optional[int]:
        """The weights' bytes as the checkpoint stores them: each dtype's count times its size (None when a dtype
        is one the table does not know)."""
        if not self.parameters or any(dtype not in DTYPE_BYTES for dtype in self.parameters):
            return None
        return sum(count * DTYPE_BYTES[dtype] for dtype, count in self.parameters.items())


def endpoint_setting(endpoint: Optional[str], offline: bool = False,
                     environ: Optional[dict[str, str]] = None) -> Optional[str]:
    """The Hub models outside the catalog are looked up on, None for none: --offline, else --hf-endpoint, else
    huggingface_hub's own environment (HF_HUB_OFFLINE=1: none; HF_ENDPOINT: a mirror), else the public Hub."""
    env = os.environ if environ is None else environ
    if offline:
        return None
    if endpoint:
        return endpoint
    if env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return None
    return env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


# --------------------------------------------------------------------------- the lookup
def lookup(repo_id: str, revision: Optional[str] = None, *, endpoint: str = DEFAULT_ENDPOINT,
           token: Union[str, bool, None] = False, seconds: float = DEFAULT_SECONDS,
           max_bytes: int = MAX_ANSWER_BYTES) -> HubFacts:
    """The Hub's facts of `repo_id` at `revision` (default: main), or HubError.

    `token`: the operator's own token (a string), False for none (the operator: never the environment's or a
    login's), None for huggingface_hub's default (the offline CLI, as its user: HF_TOKEN or `hf auth login`)."""
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from . import hubclient  # the bounded client, installed at the first lookup

    hubclient.install()
    endpoint = endpoint.rstrip("/")
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise HubError("the Hub endpoint is not an http(s) URL")
    try:
        with hubclient.bounded(endpoint, seconds, max_bytes):
            api = HfApi(endpoint=endpoint, token=token, library_name="vllm-operator")
            info = api.model_info(repo_id, revision=revision, expand=["safetensors", "sha"])
            sha = info.sha if isinstance(info.sha, str) else None
            url = hf_hub_url(repo_id, "config.json", revision=sha or revision, endpoint=endpoint)
            answer = get_session().get(url, headers=build_hf_headers(token=token, library_name="vllm-operator"))
            hf_raise_for_status(answer)
            config = net.load_json(answer.content)
            parameters = _parameters(info.safetensors)
    except Exception as err:  # every failure becomes a category: an exception's text may quote the answer
        raise HubError(_category(err, token), gated=_is_gated(err)) from None
    if not isinstance(config, dict):
        raise HubError("config.json is not a JSON object")
    return HubFacts(config=config, sha=sha, parameters=parameters)


#: The largest small JSON file of a repo read by file_json (an adapter_config.json is under 2 KB).
MAX_FILE_BYTES = 256 * 1024


def file_url(repo_id: str, filename: str, revision: Optional[str], endpoint: str) -> str:
    """Where the Hub serves one file of a model repo at a revision (its resolve URL)."""
    quote = urllib.parse.quote
    return (f"{endpoint.rstrip('/')}/{quote(repo_id, safe='/')}/resolve/{quote(revision or 'main', safe='')}/"
            f"{quote(filename)}")


def file_json(repo_id: str, filename: str, revision: Optional[str] = None, *, endpoint: str = DEFAULT_ENDPOINT,
              seconds: float = DEFAULT_SECONDS, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """One small JSON file of a public Hub repo (an adapter's adapter_config.json), through fetch.get: one deadline,
    a byte cap, no redirect (a file the Hub keeps in LFS, which it redirects to its CDN, is refused), no token.
    HubError with a category otherwise."""
    try:
        body = net.get(file_url(repo_id, filename, revision, endpoint), seconds=seconds, max_bytes=max_bytes,
                       accept="application/json", use_proxy=True)
        return net.load_json(body)
    except net.FetchError as err:
        raise HubError(f"could not be read from {endpoint.rstrip('/')}: {err}") from None


def _parameters(safetensors: Any) -> dict[str, int]:
    counts = getattr(safetensors, "parameters", None)
    if not isinstance(counts, dict):
        return {}
    return {str(k)[:32]: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def _is_gated(err: BaseException) -> bool:
    from huggingface_hub.errors import GatedRepoError

    return isinstance(err, GatedRepoError)


def _category(err: BaseException, token: Union[str, bool, None]) -> str:
    """What went wrong, in our words: never an exception's text, which may quote what the server sent."""
    import httpx2
    from huggingface_hub import errors

    from .hubclient import Refused

    if isinstance(err, Refused):
        return str(err)  # our own words
    if isinstance(err, net.FetchError):
        return f"config.json: {err}"  # net's categories quote nothing either
    if isinstance(err, errors.GatedRepoError):
        return "the operator's token does not open this gated model" if isinstance(token, str) else GATED
    if isinstance(err, errors.RepositoryNotFoundError):
        return "no such model on the Hub (or a private one the operator's token does not open)"
    if isinstance(err, errors.RevisionNotFoundError):
        return "the Hub has no such revision of the model"
    if isinstance(err, errors.RemoteEntryNotFoundError):
        return "the model has no config.json on the Hub"
    if isinstance(err, errors.HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        return f"the Hub answered HTTP {status}" if isinstance(status, int) else "the Hub refused"
    if isinstance(err, errors.HFValidationError):
        return "not a Hub model id (organisation/name)"
    if isinstance(err, httpx2.TimeoutException):
        return "timed out"
    if isinstance(err, httpx2.TooManyRedirects):
        return "too many redirects"
    if isinstance(err, httpx2.ConnectError):
        return "connection failed"
    if isinstance(err, httpx2.HTTPError):
        return "the connection to the Hub failed"
    return "not an answer the Hub gives"


#: A token file larger than this is not a token (Hugging Face tokens are about 40 characters).
MAX_TOKEN_BYTES = 4096


def read_token_file(path: Optional[str]) -> Union[str, bool]:
    """The operator's own Hub token from a file (the chart mounts operator.hfTokenSecret there), read at each lookup
    so that a rotated Secret takes effect; False (no token) without a path. ValueError naming the file, never its
    content, when it cannot be read or is not a token."""
    if not path:
        return False
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TOKEN_BYTES + 1)
    except OSError as err:
        raise ValueError(f"the Hub token file {path} cannot be read ({err.strerror or 'error'})") from None
    token = raw.decode("utf-8", "replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"the Hub token file {path} does not hold one token")
    return token


def token_reader(path: Optional[str]) -> Callable[[], Union[str, bool]]:
    """read_token_file for each lookup, where a file that cannot be read means no token (logged, never quoted): a
    Secret being rotated must not stop the planning of models that need none."""

    def token() -> Union[str, bool]:
        try:
            return read_token_file(path)
        except ValueError as err:
            log.warning("%s; looking models up without a token", err)
            return False

    return token
