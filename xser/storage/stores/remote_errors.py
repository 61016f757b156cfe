"""How ``FsspecStore`` reads a failure of a filesystem: transient (retried), a missing bucket, denied access,
missing credentials, or other; and the words of each. Exceptions are told apart by their class names,
error codes and HTTP statuses along the cause chain, so that botocore, aiohttp or gcsfs need not be imported.
"""

from __future__ import annotations

import errno

__all__ = ["CREDENTIAL_HELP", "INSTALL", "kind_of", "missing_package", "reason"]

INSTALL = "pip install 'xser[remote]'"
#: schemes whose package the ``remote`` extra installs
_IN_EXTRA = {"s3", "s3a", "memory", "file", "local"}
#: the pip package of a missing module
_PIP = {"pyarrow": "pyarrow", "gcsfs": "gcsfs", "s3fs": "s3fs", "adlfs": "adlfs", "paramiko": "paramiko"}

def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo and len(out) < 16:
        x = todo.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        out.append(x)
        for nxt in (x.__cause__, x.__context__):
            if nxt is not None:
                todo.append(nxt)
    return out


def _names(e: BaseException) -> set[str]:
    return {c.__name__ for c in type(e).__mro__}


def _code_status(e: BaseException) -> tuple[str, int | None]:
    """The S3/HTTP error code and status of one exception in a chain, where it says."""
    response = getattr(e, "response", None)
    code, status = "", None
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", "") or "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    for attr in ("status", "code", "status_code"):
        v = getattr(e, attr, None)
        if status is None and isinstance(v, int) and not isinstance(v, bool) and 100 <= v < 600:
            status = v
    return code, status


_TRANSIENT_NAMES = {
    "ConnectionError", "TimeoutError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "HTTPClientError", "ClientConnectionError", "ClientPayloadError",
    "ServerDisconnectedError", "ServerTimeoutError", "ClientOSError", "IncompleteRead", "ResponseStreamingError",
    "FSTimeoutError", "ProtocolError", "RemoteDisconnected", "ChunkedEncodingError",
}  # fmt: skip
_TRANSIENT_ERRNO = {
    errno.ECONNRESET, errno.ETIMEDOUT, errno.EPIPE, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET, errno.EAGAIN, errno.EBUSY,
    getattr(errno, "EREMOTEIO", 121),
}  # fmt: skip
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed", "InternalError",
    "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "ConditionalRequestConflict",  # S3: a concurrent conditional write to the key is in progress (retry: 412 then)
}  # fmt: skip
_CREDENTIAL_NAMES = {
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "DefaultCredentialsError",
    "RefreshError",
}  # fmt: skip
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "Forbidden"}


def kind_of(e: BaseException) -> str:
    """``credentials``, ``bucket``, ``denied``, ``transient`` or ``other``."""
    chain = _chain(e)
    for x in chain:
        if _names(x) & _CREDENTIAL_NAMES or "Unable to locate credentials" in str(x):
            return "credentials"
    for x in chain:
        code, _ = _code_status(x)
        if code == "NoSuchBucket" or "specified bucket does not exist" in str(x):
            return "bucket"
    for x in chain:
        code, status = _code_status(x)
        if isinstance(x, PermissionError) or code in _DENIED_CODES or status in (401, 403):
            return "denied"
    for x in chain:
        code, status = _code_status(x)
        if code in _TRANSIENT_CODES or (status is not None and (status >= 500 and status not in (501, 505) or status == 429)):
            return "transient"
        if _names(x) & _TRANSIENT_NAMES:
            return "transient"
        if isinstance(x, OSError) and x.errno in _TRANSIENT_ERRNO:
            return "transient"
        if "reduce your request rate" in str(x):
            return "transient"
    return "other"


def reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e) or type(e).__name__
    return text


CREDENTIAL_HELP = {
    "s3": "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or pass storage_options={'anon': True} for public buckets",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS, run `gcloud auth application-default login`, "
    "or pass storage_options={'token': 'anon'} for public buckets",
}
CREDENTIAL_HELP["s3a"] = CREDENTIAL_HELP["s3"]
CREDENTIAL_HELP["gcs"] = CREDENTIAL_HELP["gs"]


def missing_package(scheme: str, e: ImportError) -> str:
    """The message for a scheme whose package is missing: the package, and the pip command that installs it."""
    from fsspec.registry import known_implementations  # type: ignore[import-untyped,import-not-found,unused-ignore]

    module = None
    cause: BaseException | None = e
    while cause is not None and module is None:
        module = getattr(cause, "name", None)
        cause = cause.__cause__ or cause.__context__
    if not module:
        cls = known_implementations.get(scheme, {}).get("class", "")
        module = cls.split(".")[0] if cls and not cls.startswith("fsspec.") else "the package of this scheme"
    package = _PIP.get(module.split(".")[0], module.split(".")[0])
    install = INSTALL if scheme in _IN_EXTRA else f"{INSTALL} {package}"
    return f"{scheme}:// URLs need the package '{package}', which is not installed: {install}"


# -- the store
